"""``python -m knobtune.trainers.tensorflow {probe,burst,diagnose} --request IN --result OUT``: one trial's child."""
from __future__ import annotations

from knobtune.trainers.common.child import Handler, main

COMMANDS = ("probe", "burst", "diagnose")


def handlers() -> dict[str, Handler]:
    # imported after the version check: an old TensorFlow lacks Keras 3, which these modules use
    from knobtune.trainers.tensorflow import burst, diagnose, probe

    return {"probe": probe.run, "burst": burst.run, "diagnose": diagnose.run}


if __name__ == "__main__":
    main("tensorflow", COMMANDS, handlers)
