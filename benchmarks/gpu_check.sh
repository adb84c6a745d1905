#!/usr/bin/env bash
# GPU check, for a CUDA machine: the CUDA-marked tests (no host-device sync inside a window,
# fp16 skips counted, CUDA graphs replayed, CUDA graphs x accumulation refused, TF32 reaching the
# device), one burst per CUDA-graph mode with accumulation_steps = 2 (must be "invalid"), then a
# short digits-cnn study with the CUDA knobs on (fp16 + GradScaler, bf16, cuDNN flags, pin_memory,
# channels_last, compile with CUDA graphs, accumulation, TF32, optimizer_impl, dataloader_in_order,
# expandable_segments), then the winner exported, short GPU-sized digits-resnet and charlm studies
# (each trial's line says whether its child was forked from the warm server; the confirmed speedup),
# the own-loop script in production, a 2-trial --jobs auto run (one GPU per trial, read back), and
# with two or more GPUs a data-parallel study (nproc = "auto": NCCL, the DDP knobs with bf16
# compression) and its winner under torchrun (skipped, and said so, with one GPU).
# Prints what it measured. Budget: about 10 minutes.
#
#   benchmarks/gpu_check.sh            # with knobtune installed (make install), or
#   PYTHON=python3 benchmarks/gpu_check.sh   # from a source tree: wheels in .whl/ are installed first
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/knobtune-site .whl/*.whl
  export PYTHONPATH=/tmp/knobtune-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
export KNOBTUNE_CACHE_DIR=$work/cache
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this script is for a GPU box'; print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"

# one line per trial of study $1 in $work/gpu.db: outcome, rate, accuracy, warm-up, how its child started, knobs
show() {
"$PY" - "$work/gpu.db" "$1" <<'PY'
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=sys.argv[2], storage=f"sqlite:///{sys.argv[1]}")
print(f"{'#':>3} {'outcome':<8} {'samples/s':>10} {'acc':>6} {'warmup_s':>8} {'settle':>6} {'skips':>5} {'sync':>4} {'start':>6}  knobs")
for t in study.trials:
    a = t.user_attrs
    if "outcome" not in a:
        continue
    knobs = {k: v["value"] for k, v in a["knobs"].items() if v["applied"] and k in (
        "batch_size", "accumulation_steps", "num_workers", "pin_memory", "amp", "compile", "channels_last",
        "cudnn_benchmark", "cudnn_deterministic", "matmul_precision", "optimizer_impl", "dataloader_in_order",
        "expandable_segments")}
    print(f"{t.number:>3} {a['outcome']:<8} {a.get('samples_per_second', 0):>10,.0f} {a.get('val_accuracy', 0):>6.3f} "
          f"{a.get('warmup_seconds', 0):>8.1f} {a.get('settle_samples', 0):>6} {a.get('amp_skipped_steps', 0):>5} "
          f"{'yes' if (a.get('applied') or {}).get('per_step_sync') else 'no':>4} {a.get('child_start') or '-':>6}  {knobs}"
          + (f"  short windows: {a['short_windows']}" if a.get('short_windows') else "")
          + (f"  {a['failure'].splitlines()[0]}" if a.get('failure') else ""))
confirmed = study.user_attrs.get("confirmed") or {}
if confirmed:
    print("confirmed:", {k: confirmed.get(k) for k in ("baseline", "winner", "speedup", "speedup_range", "medians")})
PY
}
echo "== knobtune env"
"$PY" -m knobtune env
echo "== CUDA tests"
timeout 240 "$PY" -m pytest -q -m cuda tests/test_cuda.py
echo "== CUDA graphs with gradient accumulation (each must be refused as invalid, before training)"
"$PY" - <<'PY'
from knobtune.search.launch.runner import run_child
from knobtune.spaces import for_framework
from knobtune.trainers.common.wire import Burst, Request
ctx = {"hardware": {"cuda": True, "bf16": True, "tf32": True, "usable_cores": 8}, "workload": {"batch_size": 64}}
for mode in ("reduce-overhead", "max-autotune"):
    for k in (1, 2):
        knobs = {**for_framework("pytorch").defaults(ctx), "compile": mode, "accumulation_steps": k}
        child = run_child("pytorch", "burst", Request(workload="digits-cnn", knobs=knobs,
                          burst=Burst(train_samples=4096, warmup_samples=1024, windows=4)), 300)
        report = (child.result.applied or {}).get("compile_report") or {}
        print(f"compile={mode:<15} accumulation_steps={k}: {child.outcome:<8} "
              f"{child.result.samples_per_second or 0:>10,.0f} samples/s  replays={report.get('cudagraph_replays')} "
              f"skips={report.get('cudagraph_skips')}  {(child.failure or '').splitlines()[0] if child.failure else ''}")
PY
echo "== short digits-cnn study with the CUDA knobs"
timeout 300 "$PY" -m knobtune run benchmarks/gpu-digits-cnn.toml --storage "sqlite:///$work/gpu.db" || true
"$PY" -m knobtune export gpu-digits-cnn --storage "sqlite:///$work/gpu.db" -o "$work/best.json"
cat "$work/best.json"
show gpu-digits-cnn
echo "== GPU-sized digits-resnet and charlm studies (channels_last, cuDNN autotuning, AMP, compile, attention kernels)"
for name in gpu-digits-resnet gpu-charlm; do
  timeout 200 "$PY" -m knobtune run "benchmarks/$name.toml" --storage "sqlite:///$work/gpu.db" --no-diagnose \
    --artifacts none || true
  show "$name"
done
echo "== the example own-loop script through the Tuned API: production with fp16 + pinned memory + workers"
cat > "$work/cuda-config.json" <<'JSON'
{"format": "knobtune.best/1", "framework": "pytorch", "study": "gpu-check", "trial": 0,
 "knobs": {"batch_size": 256, "num_workers": 4, "persistent_workers": true, "prefetch_factor": 4,
           "pin_memory": true, "amp": "fp16", "compile": "off", "accumulation_steps": 1},
 "metrics": {"samples_per_second": 1.0}, "fingerprint": {}}
JSON
KNOBTUNE_CONFIG="$work/cuda-config.json" KNOBTUNE_WATCHDOG_S=1 timeout 120 "$PY" studies/own_loop_pytorch.py --epochs 8
echo "== --jobs auto: one trial per GPU, each child pinned to its GPU and its share of the cores (read back)"
timeout 100 "$PY" -m knobtune run benchmarks/gpu-digits-cnn.toml --storage "sqlite:///$work/jobs.db" --name gpu-jobs \
  --jobs auto --trials 2 --no-confirm --no-diagnose --artifacts none || true
"$PY" - "$work/jobs.db" <<'PY'
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="gpu-jobs", storage=f"sqlite:///{sys.argv[1]}")
print("study partition:", study.user_attrs.get("partition"))
for t in study.trials:
    a = t.user_attrs
    if "outcome" in a:
        print(f"#{t.number} {a['outcome']:<8} share {a.get('partition')}  child read back {a.get('placement')}")
PY
echo "== data-parallel trials: [study] nproc = \"auto\" (one rank per GPU, NCCL), then the winner under torchrun"
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "${gpus:-0}" -gt 1 ]; then
  sed -e 's/^name = "gpu-digits-cnn"/name = "gpu-ddp"\nnproc = "auto"/' -e 's/^trials = 10/trials = 4/' \
    -e 's/^compile = .*/compile = ["off"]\nddp_comm_hook = ["none", "fp16", "bf16"]\nddp_bucket_cap_mb = [5, 25, 100]/' \
    benchmarks/gpu-digits-cnn.toml > "$work/gpu-ddp.toml"
  timeout 240 "$PY" -m knobtune run "$work/gpu-ddp.toml" --storage "sqlite:///$work/ddp.db" --no-diagnose \
    --artifacts none || true
  "$PY" - "$work/ddp.db" <<'PY'
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="gpu-ddp", storage=f"sqlite:///{sys.argv[1]}")
print("study partition:", study.user_attrs.get("partition"), "scaling:", study.user_attrs.get("scaling"))
for t in study.trials:
    a = t.user_attrs
    if "outcome" in a:
        g = a.get("group") or {}
        ranks = [(r["rank"], round(r["samples_per_second"] or 0), r["placement"]) for r in g.get("ranks", [])]
        print(f"#{t.number} {a['outcome']:<8} {a.get('samples_per_second') or 0:>10,.0f} samples/s  backend "
              f"{g.get('backend')} slowest {g.get('slowest_rank')} ranks {ranks}  {a.get('failure') or ''}")
PY
  timeout 60 "$PY" -m knobtune export gpu-ddp --storage "sqlite:///$work/ddp.db" -o "$work/ddp.json" \
    && KNOBTUNE_CONFIG="$work/ddp.json" timeout 120 "$PY" -m torch.distributed.run --standalone \
      --nproc_per_node "$gpus" studies/own_loop_pytorch.py --epochs 2 || true
else
  echo "skipped: $gpus GPU visible (data-parallel trials need two or more)"
fi
