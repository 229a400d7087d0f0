"""Write tests/engine/golden/history.json: the recorded history of eng_golden.golden.

python tests/engine/golden/make_golden.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import eng_golden  # noqa: E402

from engine import Engine  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(os.path.join(d, "engine.db"), clock=eng_golden.clock(), inline_activities=True)
        eng_golden.register(eng)
        eng.start("golden", "golden/1", eng_golden.INPUT)
        eng.run_until_complete("golden/1")
        events = []
        for e in eng.history("golden/1"):
            d_ = e.to_json()
            err = d_["attrs"].get("error")
            if isinstance(err, dict):
                err.pop("traceback", None)  # machine-specific paths
            d_["attrs"].pop("worker", None)
            events.append(d_)
        out = {"workflow": "golden", "workflow_id": "golden/1", "result": eng.result("golden/1"), "events": events}
    with open(os.path.join(HERE, "history.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(events)} events to {os.path.join(HERE, 'history.json')}")


if __name__ == "__main__":
    main()
