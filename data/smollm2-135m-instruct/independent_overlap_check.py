"""A check of a rows file against the evaluation sets, independent of `corpus`'s own: word 13-grams (lower-cased
`\\w+` runs) of each row's prompt and response against those of every turn of HumanEval, MT-Bench and GSM8K test.

Two pieces of benchmark wording are left out on both sides, because the mixes reuse them as templates on purpose:
GSM8K's instruction suffix and the HumanEval harness's opening line (the first "solve" template). Prints JSON:

    python data/smollm2-135m-instruct/independent_overlap_check.py rows.jsonl
"""
import json
import re
import sys

from dflash_retrace.prompts import load_prompts

TEMPLATE_WORDING = (
    "Please reason step by step, and put your final answer within \\boxed{}.",  # GSM8K's suffix
    "Write a solution to the following problem and make sure that it passes the tests:",  # HumanEval harness
)


def words(text: str) -> list:
    for wording in TEMPLATE_WORDING:
        text = text.replace(wording, " ")
    return re.findall(r"\w+", text.lower())


def grams(text: str, n: int = 13) -> set:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def main(path: str) -> dict:
    evaluation = set()
    for name in ("humaneval", "mt-bench", "gsm8k"):
        for item in load_prompts(name, seed=None):
            for turn in item["turns"]:
                evaluation |= grams(turn)
    rows = prompts = responses = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows += 1
            prompts += bool(grams(row.get("prompt", "")) & evaluation)
            responses += bool(grams(row.get("response", "")) & evaluation)
    return {"file": path, "rows": rows, "eval_13grams": len(evaluation), "prompts_sharing": prompts,
            "responses_sharing": responses}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
