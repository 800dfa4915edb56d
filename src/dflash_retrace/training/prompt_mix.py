"""A broad chat prompt mix for regenerating drafter training data (code, math, writing), disjoint from every
evaluation set.

The target answers these prompts itself (`regenerate`), so its own outputs are the drafter's labels. The mix
covers the kinds of requests a chat target gets: writing a solution to a specified function, explaining and
completing code, step-by-step arithmetic word problems and writing tasks on prose excerpts. Sources:

- **code**: Python standard library functions (see `corpus`); "solve" prompts show only the signature
  and docstring of a documented function;
- **math**: word problems generated here from templates with seeded random names and numbers (no dataset);
- **prose**: SOTU / Brown / Shakespeare excerpts (see `corpus`) with writing instructions.

Every prompt sharing 13 words of content with HumanEval, MT-Bench or GSM8K test (or containing a shorter
evaluation prompt) is dropped and counted; the wording of the templates (these, and the harness's HumanEval
instruction and math suffix) is not content (see `corpus._keep_disjoint`).
"""

from __future__ import annotations

import ast
import random

from . import corpus

SOLVE_TEMPLATES = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{code}\n```",
    "Implement this Python function:\n```python\n{code}\n```",
    "Complete the body of this function so that it does what its docstring says:\n```python\n{code}\n```",
)
MATH_SUFFIXES = (
    "\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "\nExplain your reasoning step by step.",
    "",
)
WRITING_TEMPLATES = {
    "essay": "Write a short essay on the main theme of this passage:\n\n{text}",
    "letter": "Write a letter to a friend describing the ideas in this passage:\n\n{text}",
    "story": "Write a short story inspired by this passage:\n\n{text}",
    "points": "List the key points of this passage as bullet points:\n\n{text}",
    "simple": "Explain this passage to a twelve-year-old:\n\n{text}",
    "critique": "What are the strengths and weaknesses of the argument in this passage?\n\n{text}",
}
_NAMES = ("Alice", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena",
          "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki", "Zoe")
_ITEMS = ("apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "eggs")


def _math_problem(rng: random.Random) -> str:
    """One arithmetic word problem from a seeded template (names, items and numbers are random)."""
    a, b, c = rng.randint(3, 60), rng.randint(2, 40), rng.randint(1, 20)
    n1, n2 = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    price, hours, weeks = rng.randint(2, 25), rng.randint(4, 40), rng.randint(2, 8)
    pct = rng.choice((10, 20, 25, 30, 40, 50, 60, 75))
    speed, time_h = rng.randint(20, 90), rng.randint(2, 9)
    templates = (
        f"{n1} has {a} {item}. {n1} buys {b} more {item} and then gives {c} to {n2}. "
        f"How many {item} does {n1} have now?",
        f"A shop sells {item} for ${price} each. {n1} buys {c} {item} and pays with a ${price * c + b} bill. "
        f"How much change does {n1} get?",
        f"{n1} reads {a} pages a day for {c} days, then {b} pages a day for {weeks} days. "
        "How many pages does she read in total?",
        f"A train travels at {speed} miles per hour for {time_h} hours, then at {speed + 10} miles per hour for "
        f"{c} more hours. How far does it travel in total?",
        f"{n1} earns ${price} per hour and works {hours} hours a week. How much does {n1} earn in {weeks} weeks?",
        f"There are {a * 4} students in a school club. {pct}% of them are girls. How many boys are in the club?",
        f"{n1} has ${a * 10}. She spends {pct}% of it on a jacket and ${b} on lunch. How much money is left?",
        f"A farmer has {a} rows of trees with {b} trees in each row. {c} trees are cut down. "
        "How many trees are left?",
        f"{n1} and {n2} share {a * 6} {item} in the ratio 1:2. How many {item} does {n2} get?",
        f"A recipe needs {c} cups of flour for {weeks} cakes. How many cups of flour are needed for "
        f"{weeks * 3} cakes?",
        f"{n1} runs {c} kilometers every weekday and {b} kilometers on Saturday. How many kilometers does {n1} run "
        f"in {weeks} weeks?",
        f"A box holds {b} {item}. {n1} has {a * b + c} {item}. How many full boxes can {n1} fill, and how many "
        f"{item} are left over?",
    )
    return rng.choice(templates) + rng.choice(MATH_SUFFIXES)


DEFAULT_SHARES = (0.3, 0.2, 0.25, 0.25)  # solve, code, math, writing + prose


def check_shares(shares) -> tuple:
    """`shares` as four floats (a "0.3,0.2,0.25,0.25" string too), or a ValueError naming the fix."""
    if isinstance(shares, str):
        try:
            shares = tuple(float(x) for x in shares.split(","))
        except ValueError:
            shares = ()
    shares = tuple(shares)
    if len(shares) != 4 or min(shares) < 0 or abs(sum(shares) - 1) > 1e-6:
        raise ValueError(f"mix shares {shares!r}: give four non-negative shares of solve, code, math and writing "
                         "rows that sum to 1, e.g. --mix-shares 0.3,0.2,0.25,0.25")
    return shares


def _signature_and_docstring(code: str) -> str | None:
    """`def f(...):` plus its docstring, or None when the function has no docstring."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return None
    doc = ast.get_docstring(node, clean=False) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if not doc or len(doc.split()) < 6:
        return None
    header = code[: code.index(":", code.index(")")) + 1] if ")" in code else None
    if header is None or "\n" in header.split("(")[0]:
        return None
    return f'{header}\n    """{doc.strip()}\n    """\n'


def build_prompt_mix(num_prompts=6000, seed=0, shares=DEFAULT_SHARES, cache_dir=None, check_overlap=True,
                     packages=()) -> tuple:
    """(rows, manifest): `num_prompts` rows (`id`, `prompt`, `source`, `kind`, `template`), split by `shares`
    over (solve, code, math, writing+prose); deterministic for a given seed, interpreter, archives and `packages`
    (import names of installed packages whose functions join the stdlib's as code to solve or discuss)."""
    shares = check_shares(shares)
    rng, paths, funcs, _, _, code_report = corpus._plan(10, seed, 0.5, cache_dir, packages)
    n_solve, n_code, n_math = (round(num_prompts * s) for s in shares[:3])
    n_prose = num_prompts - n_solve - n_code - n_math
    rows = []
    solvable = [(w, s) for w, s in ((w, _signature_and_docstring(c)) for w, c in funcs) if s]
    for k, (where, spec) in enumerate(solvable[:n_solve]):
        rows.append({"prompt": SOLVE_TEMPLATES[k % len(SOLVE_TEMPLATES)].format(code=spec.rstrip()),
                     "source": corpus.code_source(where), "kind": "code", "template": f"solve{k % 3}"})
    code_rows, _ = corpus.build_prompts(n_code, seed=seed + 1, code_share=1.0, cache_dir=cache_dir,
                                            check_overlap=False, packages=packages)
    rows += code_rows
    for k in range(n_math):
        rows.append({"prompt": _math_problem(rng), "source": "synthetic-math", "kind": "math", "template": "math"})
    prose_rows, _ = corpus.build_prompts(n_prose // 2, seed=seed + 2, code_share=0.0, cache_dir=cache_dir,
                                             check_overlap=False)
    rows += prose_rows
    writing = list(WRITING_TEMPLATES)
    per = [(n_prose - n_prose // 2) // 3 + (1 if i < (n_prose - n_prose // 2) % 3 else 0) for i in range(3)]
    for name, _what, k, doc_name, text in corpus._prose_picks(paths, per, rng):
        excerpt = (corpus._shakespeare_excerpt(text, rng) if name == "shakespeare"
                   else corpus._words_excerpt(text, rng))
        tmpl = writing[(k + rng.randrange(len(writing))) % len(writing)]
        rows.append({"prompt": WRITING_TEMPLATES[tmpl].format(text=excerpt),
                     "source": f"{corpus.SOURCES[name]['spec']}:{doc_name}", "kind": "prose",
                     "template": f"writing/{tmpl}"})
    dropped, checked = 0, []
    if check_overlap:
        rows, dropped, checked = corpus._drop_eval_overlap(rows, lambda r: r["prompt"])
    rows = list({r["prompt"]: r for r in rows}.values())  # exact duplicates (synthetic math) once
    rng.shuffle(rows)
    prefix = "m" if seed == 0 else f"s{seed}m"  # seed 0 keeps the ids of the committed answers; others never clash
    for i, row in enumerate(rows):
        row["id"] = f"{prefix}{i:05d}"
    counts = corpus.template_counts(rows)
    manifest = {"seed": seed, "num_prompts": len(rows), "shares": list(shares), "counts": counts,
                "code_sources": code_report,
                "solve_templates": list(SOLVE_TEMPLATES), "writing_templates": WRITING_TEMPLATES,
                "eval_overlap_check": {"ngram_words": corpus.NGRAM_WORDS, "method": corpus.OVERLAP_METHOD,
                                       "checked": checked, "dropped": dropped},
                "disjoint_from": ["HumanEval", "MT-Bench", "GSM8K test"]}
    return rows, manifest
