"""``python -m knobtune.trainers.pytorch {probe,burst,diagnose} --request IN --result OUT``: one trial's child."""
from __future__ import annotations

from knobtune.trainers.common.child import Handler, main

COMMANDS = ("probe", "burst", "diagnose")


def handlers() -> dict[str, Handler]:
    # imported after the version check: an old torch lacks names these modules use at import
    from knobtune.trainers.pytorch import burst, diagnose, probe

    return {"probe": probe.run, "burst": burst.run, "diagnose": diagnose.run}


if __name__ == "__main__":
    main("pytorch", COMMANDS, handlers)
