"""Runs one lm-evaluation-harness evaluation and writes its metrics and per-request samples as
JSON; tests/e2e/test_lm_eval.py starts it in a subprocess, so lm-eval (and the `datasets`
library under it) import with the offline environment the test sets and nothing else in the
test session is affected.

usage: python lm_eval_driver.py MODEL MODEL_ARGS TASK INCLUDE_PATH OUT_JSON [--chat]
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> None:
    model, model_args, task, include_path, out_path = argv[:5]
    chat = "--chat" in argv[5:]
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=include_path, include_defaults=False)
    results = simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=tasks,
                              log_samples=True, apply_chat_template=chat, limit=None)
    samples = [{"doc": s["doc"], "arguments": s["arguments"], "resps": s["resps"], "target": s["target"]}
               for s in results["samples"][task]]
    with open(out_path, "w") as f:
        json.dump({"results": results["results"][task], "samples": samples}, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
