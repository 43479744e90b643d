import random
random.seed(0)
pos = "good great wonderful superb moving funny charming brilliant delightful".split()
neg = "bad awful boring dull tedious clumsy weak messy forgettable".split()
filler = "the film is a story with an actor and some plot scenes that feel quite".split()
rows = []
for i in range(240):
    s = random.choice([1, -1])
    words = random.sample(filler, 5) + [random.choice(pos if s > 0 else neg)]
    random.shuffle(words)
    rows.append(f"{i}\t{s * round(random.uniform(0.5, 3.5), 2)}\t{' '.join(words)}.")
open("sentiment.tsv", "w").write("\n".join(rows) + "\n")
