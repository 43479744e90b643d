"""The attention page's size and the cost of capturing, on a 6-layer, 8-head Transformer and a 100-token input.

    python benchmarks/page.py --threads 1
    python benchmarks/page.py --threads 1 --long 512 --long 2000 --long 8000   # long inputs in Chromium

Long inputs (``--long T``): a random GPT-2-style decoder from a config (2 layers, 4 heads, hidden 64, positions
enough for T) runs once on T random tokens inside ``qkv.capture_attention``; the page is written with the default
byte budget (past it, each row's top k and an overview) and opened in headless Chromium (``/usr/bin/chromium``,
or ``$QKV_CHROMIUM``), timed from the request to the first drawing of the view and of the head grid.

Capturing computes the weights beside each attention call that did not ask for them (the output is the one the
model computes anyway), so a captured forward pass costs more than a plain one; outside a capture the library
checks one global variable per call.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sentiment import machine  # noqa: E402

import qkv  # noqa: E402
from qkv.models import create  # noqa: E402
from qkv.viz.page import save_attention_page  # noqa: E402


def best_of(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def long_pages(lengths: list[int]) -> None:
    import os
    import shutil

    import transformers as tf
    from playwright.sync_api import sync_playwright

    from qkv.integrations.transformers import register

    register()
    chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        for t in lengths:
            cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=t, vocab_size=1000, bos_token_id=0,
                                eos_token_id=0)
            torch.manual_seed(0)
            model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv").eval()
            with torch.no_grad(), qkv.capture_attention(model) as records:
                model(torch.randint(0, 1000, (1, t)))
            t0 = time.perf_counter()
            path = save_attention_page(Path(tmp) / f"long{t}.html", records, tokens=[f"w{i}" for i in range(t)])
            t_write = time.perf_counter() - t0
            del records
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            t0 = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("#view *")
            page.wait_for_selector("#heads img.thumb")
            t_open = time.perf_counter() - t0
            sparse = "largest weights" in page.inner_text("body")
            page.close()
            rows.append((t, path.stat().st_size, t_write, t_open, sparse, errors))
            print(rows[-1], file=sys.stderr)
        browser.close()
    print("| tokens | page size | stored as | writing the page | opening in Chromium (to the first drawing) |")
    print("|---|---|---|---|---|")
    for t, size, t_write, t_open, sparse, errors in rows:
        how = "each row's top k + overview" if sparse else "every weight (1 byte)"
        print(f"| {t:,} | {size / 1e6:.1f} MB | {how} | {t_write:.1f} s | {t_open:.1f} s"
              f"{' (errors: ' + '; '.join(errors) + ')' if errors else ''} |")


PICTURE_WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "park", "where", "big", "red",
                 "bird", "sang", "in", "green", "tree"]


def picture(path: str) -> None:
    """``docs/generation.png``: the generation page of a tiny random GPT-2 (word-level tokenizer, 4 layers, 4 heads,
    seed 0) on a prompt, 12 tokens by beam search, step 5 chosen, in headless Chromium."""
    import os
    import shutil

    import transformers as tf
    from playwright.sync_api import sync_playwright
    from tokenizers import Tokenizer, models, pre_tokenizers

    from qkv.integrations.generation import view_generation

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *dict.fromkeys(PICTURE_WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                           eos_token="</s>", unk_token="<unk>")
    cfg = tf.GPT2Config(n_embd=64, n_layer=4, n_head=4, n_positions=128, vocab_size=len(vocab), bos_token_id=1,
                        eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    chromium = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    path = os.path.abspath(path)
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the page names the model directory as given: "my-gpt2"
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained("my-gpt2")
        tokenizer.save_pretrained("my-gpt2")
        view = view_generation("my-gpt2", "the cat sat on a mat and the dog ran to", 12, strategy="beam", beams=4)
        html = save_attention_page(Path(tmp) / "gen.html", view.records, **view.page_kwargs())
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1000, "height": 900}, device_scale_factor=1)
            page.goto(html.resolve().as_uri())
            page.select_option("#gen-attention", index=3)
            page.click(".gtok[data-step='5']")
            top = page.locator("h1").bounding_box()["y"] - 8
            grid = page.locator("#heads .head-grid").first.bounding_box()
            page.screenshot(path=path, clip={"x": 0, "y": top, "width": 1000, "height": grid["y"] + grid["height"]
                                             + 8 - top}, full_page=True)
            browser.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--long", type=int, action="append", help="long-input pages of this many tokens (repeatable)")
    ap.add_argument("--picture", help="write the picture of a generation page (docs/generation.png) to this path")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.picture:
        picture(args.picture)
        return 0
    if args.long:
        print(f"Machine: {machine()}.  ")
        print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
        long_pages(args.long)
        return 0
    torch.manual_seed(0)
    model = create("transformer", src_vocab=1000, tgt_vocab=1000, dim=args.dim, num_heads=args.heads,
                   num_layers=args.layers).eval()
    t = args.tokens
    src, tgt = torch.randint(4, 1000, (1, t)), torch.randint(4, 1000, (1, t))
    mask = torch.ones(1, t, dtype=torch.bool)

    def plain():
        with torch.no_grad():
            model(src, mask, tgt)

    def captured():
        with torch.no_grad(), qkv.capture_attention(model):
            model(src, mask, tgt)

    plain()
    captured()
    t_plain, t_capture = best_of(plain, args.rounds), best_of(captured, args.rounds)
    with torch.no_grad(), qkv.capture_attention(model) as records:
        model(src, mask, tgt)
    tokens = {"source": [f"s{i}" for i in range(t)], "target": [f"t{i}" for i in range(t)]}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = save_attention_page(Path(tmp) / "page.html", records, tokens=tokens)
        t_page = time.perf_counter() - t0
        size = path.stat().st_size
    print(f"### The attention page: {args.layers} layers x {args.heads} heads, {t} source and {t} target tokens\n")
    print(f"Machine: {machine()}.  ")
    print(f"Command: `python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n")
    print("| what | figure |\n|---|---|")
    print(f"| attention modules recorded | {len(records)} ({sum(r.num_heads for r in records)} head matrices) |")
    print(f"| page size (weights 1 byte each, rollout included) | {size / 1e6:.2f} MB |")
    print(f"| forward pass, plain | {1e3 * t_plain:.1f} ms |")
    print(f"| forward pass, captured | {1e3 * t_capture:.1f} ms ({t_capture / t_plain:.2f}x) |")
    print(f"| writing the page | {1e3 * t_page:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
