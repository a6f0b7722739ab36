"""One section's process: `python -m bench.perf.gpucheck <section> <json args>`
(plan.section_command), its summary as the last line of stdout."""
from __future__ import annotations

import json
import sys

from bench.perf.gpucheck.ddp import section_ddp
from bench.perf.gpucheck.kernel import (section_parity, section_parity_one, section_tune,
                                        section_warm, section_warm_one)
from bench.perf.gpucheck.runs import (section_env, section_paper, section_suite, section_text,
                                      section_tiny)
from bench.perf.gpucheck.throughput import section_lm, section_speed

SECTION_FUNCTIONS = {"env": section_env, "tiny": section_tiny, "paper": section_paper,
                     "ddp": section_ddp, "warm": section_warm, "warm_one": section_warm_one,
                     "tune": section_tune, "parity": section_parity,
                     "parity_one": section_parity_one, "speed": section_speed,
                     "lm": section_lm, "text": section_text, "suite": section_suite}


if __name__ == "__main__":
    name, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = SECTION_FUNCTIONS[name](arguments)
    print(json.dumps(result, default=str))
