"""``knobtune export NAME --format snippet``: the winner as the lines to change in a training
script, for a user who does not adopt the Tuned API. Generated from the export document (the
knobs and the learning rate the winner was measured with); framework-free text. Each knob's
lines, and the script around them, are its framework's space's (spaces/pytorch.py,
spaces/tensorflow.py: ``Knob.lines``, ``Space.script``)."""
from __future__ import annotations

from typing import Any

from knobtune.spaces import FRAMEWORKS, for_framework
from knobtune.spaces.knobs import Shown


def snippet(doc: dict[str, Any]) -> str:
    """Python source for the export ``doc``'s framework, headed by what it was measured as."""
    framework = doc.get("framework")
    if framework not in FRAMEWORKS:
        raise ValueError(f"export of framework {framework!r}: expected 'pytorch' or 'tensorflow'")
    space = for_framework(framework)
    shown = Shown(space, doc["knobs"], set(doc.get("not_applied") or {}),
                  lambda setter: _learning_rate(doc, setter),
                  cuda=bool((doc.get("fingerprint") or {}).get("cuda_available")),
                  nproc=int((doc.get("group") or {}).get("nproc") or 1))
    script = space.integrations.get(doc.get("integration") or "", space.script)
    return _header(doc) + script(shown)


def headline_speedup(doc: dict[str, Any]) -> str | None:
    """``1.46x the baseline (median of 8 paired rounds)``: the export's headline speedup, and which
    figure it is (an export written before 0.2 has only the search trial's, ``metrics.speedup``)."""
    found = doc.get("speedup") or {}
    if found.get("value"):
        return f"{found['value']:.2f}x the baseline ({found['figure']})"
    searched = (doc.get("metrics") or {}).get("speedup")
    return f"{searched:.2f}x the baseline (one search trial each)" if searched else None


def _header(doc: dict[str, Any]) -> str:
    confirmed = doc.get("confirmed") or {}
    speedup = headline_speedup(doc)
    if confirmed.get("baseline_won"):
        verdict = "no configuration beat your current settings: these are the baseline's"
    elif speedup:
        verdict = speedup
    else:
        verdict = "the best trial"
    lines = [
        f"# knobtune: study {doc.get('study')!r}, trial #{doc.get('trial')}: {verdict}.",
        "# The lines to change in your training script (names in angle brackets are yours:",
        "# train_set, model, loss_fn, optimizer, device, epochs; files, parse_fn, augment_fn for tf.data).",
    ]
    skipped = {k: v for k, v in (doc.get("not_applied") or {}).items() if v}
    if skipped:
        lines.append("# Not applied when measured (left out here): "
                     + "; ".join(f"{k}: {why}" for k, why in sorted(skipped.items())))
    return "\n".join(lines) + "\n"


def _learning_rate(doc: dict[str, Any], setter: str) -> list[str]:
    scale, lr = doc.get("lr_scale") or 1.0, doc.get("learning_rate")
    if scale == 1.0 or lr is None:
        return []
    return [f"# measured with the learning rate rescaled by {scale:.4g} ([study] lr_scaling = "
            f"{doc.get('lr_scaling')!r}) for its effective batch:", setter.format(lr=repr(lr)), ""]
