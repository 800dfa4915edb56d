"""τ of one drafter over another's, with the 95% paired bootstrap of `dflash-retrace replay`, from reports that
replayed both (the same prompts, the same acceptance lengths a replay with one of them as `--drafter` would record):

    python results/wip_run27/arm_ratio.py run27 run27d results/wip_run27/replay_heldout*_run27_vs_run26.json
"""
import json
import sys

from dflash_retrace.evaluation.replay import paired_tau_ratio_interval


def arm_ratio(path: str, num: str, den: str) -> dict:
    with open(path) as f:
        report = json.load(f)
    tau = {name: report["summary"]["methods"][name]["tau_pooled"] for name in (num, den)}
    a, b = ([p["drafters"][name]["acceptance_lengths"] for p in report["prompts"]] for name in (num, den))
    return {"report": path, **tau, "ratio": tau[num] / tau[den], "ci95": paired_tau_ratio_interval(a, b)}


if __name__ == "__main__":
    for path in sys.argv[3:]:
        print(json.dumps(arm_ratio(path, sys.argv[1], sys.argv[2])))
