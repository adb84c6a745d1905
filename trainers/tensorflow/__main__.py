"""``python -m trainers.tensorflow {probe,burst} --request IN --result OUT``: one trial's child."""
from __future__ import annotations

import sys

from trainers.common.child import main
from trainers.tensorflow import burst, diagnose, probe

if __name__ == "__main__":
    sys.exit(main("tensorflow", {"probe": probe.run, "burst": burst.run, "diagnose": diagnose.run}))
