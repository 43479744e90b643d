"""Speech data: audio reading (resampling, channels, hostile files), log-mel features against librosa, SpecAugment,
manifest and LibriSpeech readers (file:line errors, skip and count), generated corpora (held-out texts and voices,
the long split, the cache)."""

import shutil

import numpy as np
import pytest
import torch

sf = pytest.importorskip("soundfile")
librosa = pytest.importorskip("librosa")

from qkv.apps.speech.audio import load_audio, log_mel, spec_augment, warp_features  # noqa: E402
from qkv.apps.speech.synth import number_words  # noqa: E402
from qkv.data.speech import normalize_transcript, read_librispeech, read_manifest, split_utterances  # noqa: E402

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("flite") is None,
                                  reason="espeak-ng and flite are not installed (make data)")


def tone(seconds=0.5, rate=16_000, freq=440.0):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.slow
def test_load_audio_resamples_and_mixes_channels(tmp_path):
    wave = tone(rate=22_050)
    sf.write(tmp_path / "stereo.wav", np.stack([wave, -wave * 0.5], 1), 22_050)
    got = load_audio(tmp_path / "stereo.wav")
    want = librosa.resample(wave * 0.25, orig_sr=22_050, target_sr=16_000)  # the mean of the two channels
    assert got.shape == (len(want),) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, atol=2e-4)  # 16-bit PCM round trip
    sf.write(tmp_path / "a.flac", tone(), 16_000)
    assert load_audio(tmp_path / "a.flac").shape == (8000,)


@pytest.mark.parametrize("kind, message", [
    ("missing", "no such audio file"), ("garbage", "not a readable audio file"), ("empty_file", "not a readable"),
    ("zero", "empty"), ("short", "too short"), ("nan", "NaN"), ("text", "not a readable"),
    ("folder", "a folder, not an audio file")])
def test_hostile_audio_is_one_line_naming_the_file(tmp_path, kind, message):
    p = tmp_path / f"{kind}.wav"
    if kind == "garbage":
        p.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage" * 3)
    elif kind == "empty_file":
        p.write_bytes(b"")
    elif kind == "zero":
        sf.write(p, np.zeros(0, np.float32), 16_000)
    elif kind == "short":
        sf.write(p, np.zeros(100, np.float32), 16_000)
    elif kind == "nan":
        sf.write(p, np.full(4000, np.nan, np.float32), 16_000, subtype="FLOAT")
    elif kind == "text":
        p.write_text("this is not audio\n" * 50)
    elif kind == "folder":
        p.mkdir()
    with pytest.raises(ValueError, match=message) as e:
        load_audio(p, where=f"m.tsv:3: {p.name}")
    assert "m.tsv:3" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("fmt, subtype", [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("WAV", "PCM_24"), ("AIFF", "PCM_16"),
                                          ("FLAC", "PCM_16")])
@pytest.mark.parametrize("keep", [0.3, 0.77, 0.999])
def test_a_file_shorter_than_its_header_promises_is_an_error_naming_it(tmp_path, fmt, subtype, keep):
    """Truncated audio (a download cut short) is never read silently as the part there is."""
    whole = tmp_path / f"whole.{fmt.lower()}"
    sf.write(whole, tone(seconds=1.0), 16_000, format=fmt, subtype=subtype)
    data = whole.read_bytes()
    cut = tmp_path / f"cut.{fmt.lower()}"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ValueError) as e:
        load_audio(cut, where=f"m.csv:7: {cut.name}")
    message = str(e.value)
    assert message.startswith("m.csv:7: cut.") and "\n" not in message
    assert "truncated: the header promises 16000 samples (1.000 s)" in message or "not a readable" in message
    assert load_audio(whole).shape == (16_000,)


def test_a_streamed_wav_of_unknown_length_is_read(tmp_path):
    """A WAV written to a pipe says 0xFFFFFFFF bytes of data (the length was not known): read what is there."""
    path = tmp_path / "piped.wav"
    sf.write(path, tone(seconds=0.5), 16_000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at:at + 4] = (0xFFFFFFFF).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert load_audio(path).shape == (8000,)


def test_log_mel_matches_librosa(gen):
    wave = torch.randn(12_345, generator=gen, dtype=torch.float64) * 0.1
    got = log_mel(wave.float(), n_mels=40)
    power = librosa.feature.melspectrogram(y=wave.numpy(), sr=16_000, n_fft=512, hop_length=160, win_length=400,
                                           window="hann", center=True, pad_mode="reflect", power=2.0, n_mels=40)
    want = np.log(power + 1e-6).T
    assert got.shape == want.shape == (1 + 12_345 // 160, 40)
    np.testing.assert_allclose(got.numpy(), want, atol=2e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="too short"):
        log_mel(torch.zeros(100))


def test_spec_augment_masks_bands_and_spans(gen):
    x = torch.randn(200, 40, generator=gen)
    out = spec_augment(x, freq_masks=1, freq_width=8, time_masks=1, time_width=20, generator=gen)
    assert out.shape == x.shape
    changed = out != x
    cols, rows = changed.all(0), changed.all(1)
    assert cols.sum() <= 8 and rows.sum() <= 20  # one band of channels, one span of frames
    assert torch.equal(out[~rows][:, ~cols], x[~rows][:, ~cols])  # nothing else touched
    assert torch.equal(x, x.clone())  # the input is not changed in place
    same = spec_augment(x, freq_masks=0, time_masks=0)
    assert torch.equal(same, x)


@pytest.mark.parametrize("time, freq", [(1.2, 0.9), (0.85, 1.1), (1.0, 1.0)])
def test_warp_features_matches_numpy_interpolation(gen, time, freq):
    x = torch.randn(50, 20, generator=gen, dtype=torch.float64)
    got = warp_features(x, time, freq)
    # numpy's interp along the mel channels (channel k reads k / freq), then along the frames
    warped = np.stack([np.interp(np.minimum(np.arange(20) / freq, 19), np.arange(20), row) for row in x.numpy()])
    n = round(50 * time)
    want = np.stack([np.interp(np.linspace(0, 49, n), np.arange(50), warped[:, k]) for k in range(20)], 1)
    assert got.shape == (n, 20) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    with pytest.raises(ValueError, match="factors"):
        warp_features(x, 3.0)
    with pytest.raises(ValueError, match="features must be"):
        warp_features(x[0])


def test_normalize_transcript():
    assert normalize_transcript("Ça va, l'ami? It’s 3 o'clock!") == "ca va l'ami it's o'clock"
    assert normalize_transcript("  ... ") == ""


def test_number_words():
    assert number_words(0) == "zero" and number_words(17) == "seventeen" and number_words(40) == "forty"
    assert number_words(305) == "three hundred and five" and number_words(3012) == "three thousand and twelve"
    assert number_words(9999) == "nine thousand nine hundred and ninety nine"
    with pytest.raises(ValueError):
        number_words(10_000)


def _clip(path, seconds=0.5):
    sf.write(path, tone(seconds), 16_000)
    return path


def test_manifest_common_voice_csv_and_headerless(tmp_path):
    (tmp_path / "clips").mkdir()
    _clip(tmp_path / "clips" / "a.mp3.wav")
    _clip(tmp_path / "b.wav")
    (tmp_path / "cv.tsv").write_text("client_id\tpath\tsentence\tup_votes\n"
                                     "spk1\ta.mp3.wav\tHello, World!\t2\nspk2\tb.wav\tAgain.\t0\n")
    utts, skipped = read_manifest(tmp_path / "cv.tsv")
    assert [(u.text, u.speaker) for u in utts] == [("hello world", "spk1"), ("again", "spk2")] and not skipped
    assert utts[0].audio == str(tmp_path / "clips" / "a.mp3.wav") and utts[1].where.endswith("cv.tsv:3")
    (tmp_path / "ds.csv").write_text('wav_filename,wav_filesize,transcript\nb.wav,100,"one, two"\n')
    assert [u.text for u in read_manifest(tmp_path / "ds.csv")[0]] == ["one two"]
    (tmp_path / "plain.tsv").write_text(f"{tmp_path / 'b.wav'}\tthree\n")
    assert [u.text for u in read_manifest(tmp_path / "plain.tsv")[0]] == ["three"]


def test_manifest_bad_rows_name_file_and_line_or_are_skipped(tmp_path):
    _clip(tmp_path / "ok.wav")
    m = tmp_path / "m.tsv"
    m.write_text("path\tsentence\nok.wav\tfine\nmissing.wav\tgone\nok.wav\t!!!\nonlyone\n")
    with pytest.raises(ValueError, match=r"m\.tsv:3: no such audio file"):
        read_manifest(m)
    utts, skipped = read_manifest(m, on_error="skip")
    assert [u.text for u in utts] == ["fine"]
    assert sum(skipped.values()) == 3 and skipped["empty transcript"] == 1
    (tmp_path / "bad.tsv").write_text("path\tduration\nok.wav\t1\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:1: the header names no transcript column"):
        read_manifest(tmp_path / "bad.tsv")
    (tmp_path / "empty.tsv").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_manifest(tmp_path / "empty.tsv")
    (tmp_path / "odd.csv").write_text("path,text\n,no path\n~nosuchuser-qkv/a.wav,no home\n")
    assert read_manifest(tmp_path / "odd.csv", on_error="skip") == ([], {"empty audio path": 1,
                                                                         "no such audio file": 1})
    with pytest.raises(ValueError, match=r"is a folder, not a manifest file"):
        read_manifest(tmp_path)
    (tmp_path / "bin.tsv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match=r"bin\.tsv:1: not UTF-8"):
        read_manifest(tmp_path / "bin.tsv")


def test_librispeech_layout(tmp_path):
    d = tmp_path / "LibriSpeech" / "dev" / "84" / "121"
    d.mkdir(parents=True)
    _clip(d / "84-121-0000.flac")
    _clip(d / "84-121-0001.flac")
    (d / "84-121.trans.txt").write_text("84-121-0000 HELLO THERE\n84-121-0001 GENERAL KENOBI\n84-121-0002 GONE\n")
    with pytest.raises(ValueError, match=r"84-121\.trans\.txt:3: no such audio file"):
        read_librispeech(tmp_path)
    utts, skipped = read_librispeech(tmp_path, on_error="skip")
    assert [(u.text, u.speaker) for u in utts] == [("hello there", "84"), ("general kenobi", "84")]
    assert skipped == {"no such audio file": 1}
    (d / "84-121.trans.txt").write_bytes(b"84-121-0000 HELLO THERE\n84-121-0001 GENERAL \xffKENOBI\n")
    with pytest.raises(ValueError, match=r"84-121\.trans\.txt:2: not UTF-8 text"):
        read_librispeech(tmp_path)
    assert read_librispeech(tmp_path, on_error="skip")[1] == {"not UTF-8 text": 1}
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match="no \\*.trans.txt"):
        read_librispeech(tmp_path / "nothing")


def test_split_by_speaker_keeps_speakers_apart():
    from qkv.data.speech import Utterance

    utts = [Utterance(f"{s}-{i}.wav", f"text {i}", f"spk{s}") for s in range(10) for i in range(5)]
    splits = split_utterances(utts, valid=0.1, test=0.2, seed=1)
    speakers = {k: {u.speaker for u in v} for k, v in splits.items()}
    assert len(speakers["test"]) == 2 and len(speakers["valid"]) == 1
    assert not (speakers["train"] & speakers["test"]) and not (speakers["train"] & speakers["valid"])
    assert sum(len(v) for v in splits.values()) == len(utts)


@needs_espeak
def test_generated_digits_hold_out_texts_and_voices(tmp_path_factory):
    from qkv.apps.speech.synth import TEST_VOICES, TRAIN_VOICES, generate_corpus

    cache = tmp_path_factory.getbasetemp() / "speech-cache"
    corpus = generate_corpus("digits", n_train=24, n_valid=4, n_test=6, n_long=3, cache=cache, seed=5)
    s = corpus.splits
    assert [len(s[k]) for k in ("train", "valid", "test", "long")] == [24, 4, 6, 3]
    train_texts = {u.text for u in s["train"]}
    assert not train_texts & {u.text for u in s["test"] + s["valid"]}
    assert {u.speaker for u in s["train"] + s["valid"]} <= set(TRAIN_VOICES)
    assert {u.speaker for u in s["test"] + s["long"]} <= set(TEST_VOICES)
    assert min(len(u.text) for u in s["long"]) > max(len(t) for t in train_texts)
    info = sf.info(s["test"][0].audio)
    assert info.samplerate == 16_000 and info.channels == 1 and info.duration > 0.2
    again = generate_corpus("digits", n_train=24, n_valid=4, n_test=6, n_long=3, cache=cache, seed=5)
    assert [u.audio for u in again.splits["train"]] == [u.audio for u in s["train"]]  # the cache, reused


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_flite_share_sets_the_engine_of_training_utterances_only(monkeypatch, share):
    from qkv.apps.speech import synth

    def plan():
        return synth._plan("digits", 3000, 200, 300, 20, None, 3)[0]

    monkeypatch.setattr(synth, "FLITE_SHARE", None)
    uniform = plan()
    monkeypatch.setattr(synth, "FLITE_SHARE", share)
    shared = plan()
    train = [voice for split, _, voice, *_ in shared if split in ("train", "valid")]
    flite = sum(v.startswith("flite:") for v in train) / len(train)
    assert abs(flite - share) < 4 * (share * (1 - share) / len(train)) ** 0.5  # within four standard errors
    assert set(train) == set(synth.TRAIN_VOICES)  # each engine's voices all heard
    # the test and long splits, and every utterance's text, rate, pitch and noise, are the uniform draw's
    assert [u for u in shared if u[0] in ("test", "long")] == [u for u in uniform if u[0] in ("test", "long")]
    assert [u[:2] + u[3:] for u in shared] == [u[:2] + u[3:] for u in uniform]


def test_a_flite_share_outside_0_1_is_refused(monkeypatch, tmp_path):
    from qkv.apps.speech import synth

    monkeypatch.setattr(synth, "FLITE_SHARE", 1.5)
    with pytest.raises(ValueError, match="FLITE_SHARE must be None or in"):
        synth.generate_corpus("digits", n_train=4, n_valid=1, n_test=1, cache=tmp_path)


def test_sentence_texts_from_a_file(tmp_path):
    from qkv.apps.speech.synth import sentence_texts

    (tmp_path / "t.txt").write_text("Hello there my friend.\nHe is 42 years old.\nToo short.\nHello there my friend.\n"
                                    "A b c d e f g h i j k l m\nWhere is the station, please?\n")
    texts = sentence_texts(tmp_path / "t.txt", min_words=3, max_words=10)
    assert sorted(texts) == ["hello there my friend", "where is the station please"]
    with pytest.raises(ValueError, match="no such text file"):
        sentence_texts(tmp_path / "nope.txt")


@needs_espeak
def test_two_writers_of_one_cached_utterance_both_succeed(tmp_path):
    """Two runs generating one corpus into one cache at once (each with its own temporary file): both finish, and
    the cached WAV is whole (two benchmark processes once failed here on a shared `.part.wav`)."""
    from concurrent.futures import ThreadPoolExecutor

    import soundfile

    from qkv.apps.speech.synth import synthesize

    path = tmp_path / "one.wav"
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: synthesize("three one four", "espeak:en-us", path), range(4)))
    assert done == [path] * 4
    wave, rate = soundfile.read(path)
    assert rate == 16000 and len(wave) > 1600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.wav"]  # no temporary file left


def test_manifest_json_lines_nemo_style(tmp_path):
    _clip(tmp_path / "a.wav")
    m = tmp_path / "train_manifest.json"
    m.write_text('{"audio_filepath": "a.wav", "duration": 0.5, "text": "Hello there"}\n\n'
                 '{"audio_filepath": "gone.wav", "text": "x"}\n{"audio_filepath": "a.wav"}\n[1, 2]\n{"audio": "a.wav", '
                 '"sentence": "again", "speaker_id": 7}\n{broken\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"train_manifest\.json:3: no such audio file"):
        read_manifest(m)
    utts, skipped = read_manifest(m, on_error="skip")
    assert [(u.text, u.speaker, u.where.rsplit(":", 1)[1]) for u in utts] == [("hello there", "", "1"),
                                                                              ("again", "7", "6")]
    assert skipped == {"no such audio file": 1, "no transcript": 1, "not a JSON object": 1, "not JSON": 1}
