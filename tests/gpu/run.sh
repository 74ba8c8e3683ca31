#!/usr/bin/env bash
# One run on a borrowed GPU machine (see tests/gpu/README.md): GPU facts, the nvidia_driver role's checks
# (Ansible + testinfra), a verified llama.cpp CUDA build at the pinned commit, and a smoke test of llama-server
# with the tiny Gemma 4 pair and its MTP drafter, then the rollout's GPU offload check on that server as is (must
# pass) and with CUDA_VISIBLE_DEVICES= (must be refused). Needs .device/ (make gpu-bundle). Writes
# $OUT/gpu-report.json and $OUT/{run,ansible,testinfra,build,server,server-offload-gpu,server-offload-cpu}.log.
# Every step is timed and recorded pass/fail/skip; a step whose prerequisites did not pass is skipped, the others
# still run. Exit status 0 when no step failed.
#
#   OUT=/tmp/gpu-out bash tests/gpu/run.sh                                 # on the GPU machine
#   OUT=/tmp/gpu-out LLAMA_SERVER_BIN=/tmp/llama-server bash tests/gpu/run.sh  # no build (e.g. a CPU binary)
#
# Settings (environment): CUDA_ARCH (90), BUILD_JOBS (nproc), BUILD_TIMEOUT (s, configure + build, 390),
# GENERATOR (Ninja), GPU (auto|0|1: auto = nvidia-smi answers), PYTHON (python3), WORK (/tmp/rigkit-gpu),
# DEVICE_DIR (.device), EXPECT_GPU_NAME ("NVIDIA H200"), EXPECT_VRAM_MIB (143771), EXPECT_CC (9.0),
# EXPECT_DRIVER (empty: the version nvidia-smi reports is the pin).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$REPO/.artifacts/gpu-out}
WORK=${WORK:-/tmp/rigkit-gpu}
DEVICE_DIR=${DEVICE_DIR:-$REPO/.device}
PYTHON=$(command -v "${PYTHON:-python3}")
CUDA_ARCH=${CUDA_ARCH:-90}
BUILD_JOBS=${BUILD_JOBS:-$(nproc)}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-390}
GENERATOR=${GENERATOR:-Ninja}
LLAMA_SERVER_BIN=${LLAMA_SERVER_BIN:-}
BUILD=${BUILD:-1}
GPU=${GPU:-auto}
EXPECT_GPU_NAME=${EXPECT_GPU_NAME:-NVIDIA H200}
EXPECT_VRAM_MIB=${EXPECT_VRAM_MIB:-143771}
EXPECT_CC=${EXPECT_CC:-9.0}
EXPECT_DRIVER=${EXPECT_DRIVER:-}
export REPO OUT WORK DEVICE_DIR PYTHON CUDA_ARCH BUILD_JOBS BUILD_TIMEOUT GENERATOR LLAMA_SERVER_BIN BUILD
export EXPECT_GPU_NAME EXPECT_VRAM_MIB EXPECT_CC EXPECT_DRIVER
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
# the kit's filter plugins and test helpers import rigkit (the virtualenv's .pth does this on the controller)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/steps" "$WORK/ansible" "$WORK/llama-server" "$WORK/server-bin" "$WORK/runtime.env" "$WORK/gpu.env" "$WORK/image.env" "$WORK/image-llama-server"
rm -f "$OUT"/{run,ansible,testinfra,build,server,server-offload-gpu,server-offload-cpu,server-image-offload}.log "$OUT/gpu-report.json" "$OUT"/*.prom "$OUT/nvidia-smi-query.txt" "$OUT"/*.tar.gz
mkdir -p "$WORK/steps"
exec > >(tee -a "$OUT/run.log") 2>&1
TEE_PID=$!
# let tee finish writing run.log before the machine collects $OUT
trap 'rc=$?; exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; exit "$rc"' EXIT
RUN_STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
RUN_T0=$(date +%s.%N)
export RUN_STARTED RUN_T0
echo "rigkit GPU run: $RUN_STARTED on $(uname -n), repo $REPO, OUT $OUT, WORK $WORK"

if [ "$GPU" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU=1; else GPU=0; fi
fi
export GPU
echo "GPU mode: $GPU$([ "$GPU" = 0 ] && echo ' (no nvidia-smi answering: the GPU-only steps are skipped)')"

# the pins the server must report (the bundle's manifest carries the same, from the same file)
BUILD_NUMBER=$(sed -n 's/^llamacpp_image_build_number: *//p' "$REPO/roles/llamacpp_image/defaults/main.yml")
SHORT_COMMIT=$(sed -n 's/^llamacpp_image_commit: *//p' "$REPO/roles/llamacpp_image/defaults/main.yml" | cut -c1-7)
export BUILD_NUMBER SHORT_COMMIT
[ -f "$DEVICE_DIR/llama.cpp-manifest.json" ] ||
  echo "WARNING: no $DEVICE_DIR/llama.cpp-manifest.json: run 'make gpu-bundle' and carry .device (steps will fail)"

# ------------------------------------------------------------------------------------------------ steps
STEPS=()
declare -A BG_PIDS=()

status_of() { cat "$WORK/steps/$1/status" 2>/dev/null || echo "not run"; }
detail() { printf '%s\n' "$*" >>"$STEP_DIR/detail"; echo "    $*"; }
skip() { detail "skipped: $*"; exit 77; }

_run_step() { # NAME DEPS FUNCTION: run FUNCTION in a subshell with errexit; record status/seconds/rc/detail
  local name=$1 deps=$2 fn=$3 dep st rc=0 t0 t1
  export STEP_DIR="$WORK/steps/$name"
  mkdir -p "$STEP_DIR"
  for dep in $deps; do
    st=$(status_of "$dep")
    if [ "$st" != pass ]; then
      echo "skip" >"$STEP_DIR/status"
      echo "0" >"$STEP_DIR/seconds"
      echo "needs $dep ($st)" >"$STEP_DIR/detail"
      echo "=== [$name] skip: needs $dep ($st)"
      return 0
    fi
  done
  echo "=== [$name] start $(date -u +%T)"
  t0=$(date +%s.%N)
  # a background subshell keeps errexit (a subshell tested with `||` would ignore it)
  ("$fn") &
  wait $! || rc=$?
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }' >"$STEP_DIR/seconds"
  echo "$rc" >"$STEP_DIR/rc"
  case $rc in 0) st=pass ;; 77) st=skip ;; *) st=fail ;; esac
  echo "$st" >"$STEP_DIR/status"
  echo "=== [$name] $st after $(cat "$STEP_DIR/seconds") s (rc $rc)"
}
step() { STEPS+=("$1"); _run_step "$@"; write_report; }
step_bg() { STEPS+=("$1"); _run_step "$@" & BG_PIDS[$1]=$!; }
join_step() { wait "${BG_PIDS[$1]}" || true; write_report; }

# ------------------------------------------------------------------------------------------------ host
s_host() {
  "$PYTHON" - >"$STEP_DIR/data.json" <<'EOF'
import json, os, platform, shutil, subprocess
def first_line(argv):
    if not shutil.which(argv[0]):
        return None
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
    return lines[-1] if argv[0] == "nvcc" and lines else (lines[0] if lines else None)
mem = dict(l.split(":", 1) for l in open("/proc/meminfo").read().splitlines())
print(json.dumps({
    "hostname": platform.node(), "kernel": platform.release(), "machine": platform.machine(),
    "os": (open("/etc/os-release").read().split('PRETTY_NAME="')[1].split('"')[0]
           if os.path.exists("/etc/os-release") else None),
    "cpus": os.cpu_count(), "mem_total": mem["MemTotal"].strip(),
    "python": platform.python_version(), "python_path": os.environ["PYTHON"],
    "nvcc": first_line(["nvcc", "--version"]), "cmake": first_line(["cmake", "--version"]),
    "ninja": first_line(["ninja", "--version"]), "gcc": first_line(["gcc", "--version"]),
    "gpu_mode": os.environ["GPU"] == "1",
}, indent=1))
EOF
  detail "$("$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print(", ".join(f"{k}={d[k]}" for k in ("cpus","mem_total","python","nvcc","cmake","ninja","gcc")))' <"$STEP_DIR/data.json")"
}

# ------------------------------------------------------------------------------------------------ GPU facts
s_gpu_facts() {
  [ "$GPU" = 1 ] || skip "no GPU (nvidia-smi absent or not answering)"
  nvidia-smi
  local q
  q=$(nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader,nounits | head -1)
  detail "nvidia-smi: $q"
  "$PYTHON" - "$q" >"$STEP_DIR/data.json" <<'EOF'
import json, os, subprocess, sys
name, memory, cc, driver = [f.strip() for f in sys.argv[1].split(",")]
def read(path):
    try:
        return open(path).read().strip()
    except OSError:
        return None
print(json.dumps({
    "name": name, "memory_total_mib": int(memory), "compute_cap": cc, "driver_version": driver,
    "nvidia_smi_L": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip(),
    "dev_nvidia": sorted(p for p in os.listdir("/dev") if p.startswith("nvidia")),
    "sys_module_nvidia_version": read("/sys/module/nvidia/version"),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
}, indent=1))
EOF
  {
    echo "GPU_NAME=\"$(echo "$q" | cut -d, -f1 | xargs)\""
    echo "GPU_MEM=$(echo "$q" | cut -d, -f2 | xargs)"
    echo "GPU_CC=$(echo "$q" | cut -d, -f3 | xargs)"
    echo "GPU_DRIVER=$(echo "$q" | cut -d, -f4 | xargs)"
  } >"$WORK/gpu.env"
}

# ------------------------------------------------------------------------------------------------ wheels
s_wheels() {
  if "$PYTHON" -c 'import ansible, testinfra' 2>/dev/null; then
    detail "ansible and testinfra already importable by $PYTHON: nothing installed"
    return 0
  fi
  rm -rf "$WORK/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    "$DEVICE_DIR"/wheels/*.whl
  PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c \
    'import ansible.release, testinfra, cryptography; print("ansible-core", ansible.release.__version__)' \
    >"$STEP_DIR/versions.txt"
  detail "installed into $WORK/site: $(cd "$DEVICE_DIR/wheels" && echo *.whl)"
  detail "$(cat "$STEP_DIR/versions.txt")"
}

ansible_bin() { # the directory that holds ansible-playbook for $PYTHON
  local d
  for d in "$(dirname "$PYTHON")" "$WORK/site/bin" "$(dirname "$(command -v ansible-playbook 2>/dev/null || echo /x/x)")"; do
    [ -x "$d/ansible-playbook" ] && { echo "$d"; return 0; }
  done
  return 1
}

ansible_setup() {
  # shellcheck disable=SC1091
  source "$WORK/gpu.env"
  mkdir -p "$WORK/ansible/tmp" "$WORK/ansible/home"
  local driver=${EXPECT_DRIVER:-$GPU_DRIVER}
  cat >"$WORK/ansible/inventory.yml" <<EOF
all:
  hosts:
    gpu-under-test:
      ansible_connection: local
      ansible_python_interpreter: "$PYTHON"
      rig_gpu:
        name: "$EXPECT_GPU_NAME"
        vram_mib: $EXPECT_VRAM_MIB
        compute_capability: "$EXPECT_CC"
      nvidia_driver_version: "$driver"
EOF
  cat >"$WORK/ansible/verify.yml" <<'EOF'
- name: Verify this machine's GPU with the nvidia_driver role's checks
  hosts: gpu-under-test
  gather_facts: false
  tasks:
    - name: Run roles/nvidia_driver/tasks/verify.yml
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: verify
EOF
  ANSIBLE_BIN=$(ansible_bin) || { detail "no ansible-playbook for $PYTHON"; return 1; }
  export PATH="$ANSIBLE_BIN:$PATH" ANSIBLE_CONFIG="$REPO/ansible.cfg" ANSIBLE_LOCAL_TEMP="$WORK/ansible/tmp"
  export ANSIBLE_REMOTE_TEMP="$WORK/ansible/tmp" ANSIBLE_HOME="$WORK/ansible/home" ANSIBLE_NOCOLOR=1
  export ANSIBLE_FORCE_COLOR=0 ANSIBLE_RETRY_FILES_ENABLED=0 ANSIBLE_DEPRECATION_WARNINGS=0
  detail "expected: $EXPECT_GPU_NAME, $EXPECT_VRAM_MIB MiB, sm $EXPECT_CC, driver $driver"
}

run_playbook() { # LABEL [EXTRA ARGS]: runs verify.yml, output to $STEP_DIR/out.txt and $OUT/ansible.log
  local label=$1 rc=0
  shift
  cd "$REPO"
  ansible-playbook -i "$WORK/ansible/inventory.yml" "$WORK/ansible/verify.yml" "$@" >"$STEP_DIR/out.txt" 2>&1 || rc=$?
  {
    echo "=================== $label ($(date -u +%T))"
    cat "$STEP_DIR/out.txt"
    echo "=================== $label: rc $rc"
  } >>"$OUT/ansible.log"
  return "$rc"
}

s_ansible_verify() {
  ansible_setup
  local rc=0
  run_playbook "verify, rig_gpu = this GPU (must pass)" || rc=$?
  detail "$(grep -E '"msg"|msg:' "$STEP_DIR/out.txt" | tail -2 | tr -s ' \n' ' ')"
  detail "$(grep -E 'ok=[0-9]+' "$STEP_DIR/out.txt" | tr -s ' \n' ' ')"
  [ "$rc" -eq 0 ] || { detail "ansible-playbook failed (rc $rc): see ansible.log"; return 1; }
}

s_ansible_mismatch() {
  ansible_setup
  local rc=0 override
  override=$(printf '{"rig_gpu": {"name": "%s", "vram_mib": %s, "compute_capability": "8.6"}}' \
    "$EXPECT_GPU_NAME" "$EXPECT_VRAM_MIB")
  run_playbook "verify, rig_gpu.compute_capability 8.6 (must fail)" -e "$override" || rc=$?
  local msg
  msg=$(tr -s ' \n' ' ' <"$STEP_DIR/out.txt" | grep -oE 'nvidia-smi reports.{0,400}' | head -1 || true)
  detail "ansible-playbook rc $rc; message: $msg"
  [ "$rc" -ne 0 ] || { detail "the play passed although rig_gpu says sm 8.6"; return 1; }
  if ! { echo "$msg" | grep -q "sm $GPU_CC" && echo "$msg" | grep -q "sm 8.6"; }; then
    detail "the failure does not name the mismatch (sm $GPU_CC vs sm 8.6)"
    return 1
  fi
}

s_testinfra() {
  ansible_setup
  cd "$REPO"
  local rc=0
  "$PYTHON" -m pytest tests/rig/test_nvidia.py --hosts=ansible://gpu-under-test \
    --ansible-inventory="$WORK/ansible/inventory.yml" -p no:cacheprovider -o addopts= -rA -v \
    --junitxml="$STEP_DIR/junit.xml" >"$STEP_DIR/out.txt" 2>&1 || rc=$?
  {
    echo "=================== testinfra tests/rig/test_nvidia.py ($(date -u +%T))"
    cat "$STEP_DIR/out.txt"
    echo "=================== pytest rc $rc"
  } >>"$OUT/testinfra.log"
  [ -f "$STEP_DIR/junit.xml" ] || { detail "pytest wrote no results (rc $rc): see testinfra.log"; return 1; }
  # The GPU identity checks must pass. The install checks (driver packages held, DKMS, CDI) describe a rig the
  # kit provisioned, which this machine is not: their outcomes are reported, not required.
  rc=0
  "$PYTHON" - "$STEP_DIR/junit.xml" "$STEP_DIR/data.json" >"$STEP_DIR/results.txt" <<'EOF' || rc=$?
import json, sys, xml.etree.ElementTree as ET
REQUIRED = ("test_nvidia_smi_answers_with_the_pinned_driver", "test_gpu_matches_rig_gpu", "test_nouveau_not_loaded")
results = {}
for case in ET.parse(sys.argv[1]).iter("testcase"):
    outcome, message = "passed", ""
    for kind, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        node = case.find(kind)
        if node is not None:
            outcome, message = name, (node.get("message") or "")[:400]
    results[case.get("name").split("[")[0]] = {"outcome": outcome, "message": message}
required = {name: results.get(name, {"outcome": "missing"})["outcome"] for name in REQUIRED}
json.dump({"results": results, "required": required}, open(sys.argv[2], "w"), indent=1)
for name, result in results.items():
    print(f"{name}: {result['outcome']} {result['message'][:160]}".rstrip())
outcomes = set(required.values())
sys.exit(0 if outcomes == {"passed"} else 77 if outcomes == {"skipped"} else 1)
EOF
  while IFS= read -r line; do detail "$line"; done <"$STEP_DIR/results.txt"
  [ "$rc" -ne 77 ] || detail "skipped: the GPU identity tests were skipped (reasons above)"
  [ "$rc" -ne 1 ] || detail "failed: a GPU identity test did not pass (see testinfra.log)"
  return "$rc"
}

# ------------------------------------------------------------------------------------------------ GPU metrics
# The rigs' GPU textfile collector (module_utils/gpu_metrics.py, run as the rigs' timer runs it) on this GPU, and
# nvidia-smi's own answers it is built on: the rows for both reason prefixes and the error for an unknown field.
s_gpu_metrics() {
  [ "$GPU" = 1 ] || skip "no GPU (nvidia-smi absent or not answering)"
  local fields rc=0 prefix
  {
    for prefix in EVENT_REASONS_PREFIX THROTTLE_REASONS_PREFIX; do
      fields=$("$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import gpu_metrics as g
print(",".join(g.query_fields(getattr(g, sys.argv[2]))))' "$REPO/module_utils" "$prefix")
      echo "# nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits"
      nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits 2>&1 || echo "# rc $?"
    done
    echo "# nvidia-smi --query-gpu=index,no.such.field --format=csv,noheader,nounits"
    nvidia-smi --query-gpu=index,no.such.field --format=csv,noheader,nounits 2>&1 || echo "# rc $?"
    echo "# nvidia-smi --help-query-gpu | grep -E 'clocks_(event|throttle)_reasons'"
    nvidia-smi --help-query-gpu 2>&1 | grep -E 'clocks_(event|throttle)_reasons' || true
  } >"$OUT/nvidia-smi-query.txt"
  "$PYTHON" "$REPO/module_utils/gpu_metrics.py" --output "$OUT/gpu-metrics-idle.prom" \
    --guard-state "$WORK/no-guard-state" || rc=$?
  [ "$rc" -eq 0 ] || { detail "gpu_metrics.py failed (rc $rc)"; return 1; }
  "$PYTHON" - "$OUT/gpu-metrics-idle.prom" "$EXPECT_VRAM_MIB" >"$STEP_DIR/data.json" <<'EOF'
import json, sys
samples = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or not line.strip():
        continue
    series, value = line.rsplit(" ", 1)
    samples[series] = float(value)
def first(metric):
    return next((v for s, v in samples.items() if s.split("{")[0] == metric), None)
data = {"samples": len(samples), "success": first("rigkit_gpu_collector_success"),
        "temperature_celsius": first("rigkit_gpu_temperature_celsius"),
        "power_draw_watts": first("rigkit_gpu_power_draw_watts"),
        "memory_total_mib": (first("rigkit_gpu_memory_total_bytes") or 0) / 2**20,
        "slowdown_series": sorted(s for s in samples if s.startswith("rigkit_gpu_clock_slowdown"))}
data["ok"] = (data["success"] == 1 and data["temperature_celsius"] is not None
              and data["memory_total_mib"] == float(sys.argv[2]) and len(data["slowdown_series"]) == 5)
print(json.dumps(data, indent=1))
sys.exit(0 if data["ok"] else 1)
EOF
  detail "$(tr -d '\n' <"$STEP_DIR/data.json" | cut -c1-400)"
}

# ------------------------------------------------------------------------------------------------ the image's binary
# The llama-server of the kit's own CUDA image (docker/Dockerfile on the stand-in CUDA base; `make_bundle.py
# image`): the bytes the rigs' containers run, here on a real GPU with this machine's CUDA libraries. It must find
# the GPU (--list-devices: CUDA0) and, started as the rigs start it, hold both models on it (the offload check).
image_env() {
  # shellcheck disable=SC1091
  [ ! -f "$WORK/image.env" ] || source "$WORK/image.env"
}
s_image_binary() {
  [ "$GPU" = 1 ] || skip "no GPU"
  [ -f "$DEVICE_DIR/image/image.json" ] || skip "no $DEVICE_DIR/image (make_bundle.py image --image TAG)"
  local bin="$WORK/image-llama-server" want got ld
  gzip -dc "$DEVICE_DIR/image/llama-server.gz" >"$bin"
  chmod 0755 "$bin"
  want=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["binary_sha256"])' "$DEVICE_DIR/image/image.json")
  got=$(sha256sum "$bin" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { detail "sha256 $got, image.json says $want"; return 1; }
  detail "$(tr '\n' ' ' <"$DEVICE_DIR/image/BUILD_INFO")"
  ld=$("$PYTHON" -c 'import json,sys; print(":".join(json.load(open(sys.argv[1])).get("ld_library_path", [])))' \
    "$WORK/steps/cuda-env/data.json")
  echo "export LD_LIBRARY_PATH=\"$ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" >"$WORK/image.env"
  image_env
  ldd "$bin" >"$STEP_DIR/ldd.txt" 2>&1 || true
  detail "libraries: $(grep -oE '(libcuda|libcudart|libcublas|libcublasLt)[^ ]* => [^ ]+' "$STEP_DIR/ldd.txt" | tr '\n' ' ')"
  if grep -q "not found" "$STEP_DIR/ldd.txt"; then detail "missing: $(grep 'not found' "$STEP_DIR/ldd.txt" | xargs)"; return 1; fi
  got=$("$bin" --version 2>&1 | tr '\n' ' ')
  detail "--version: $got"
  echo "$got" | grep -q "build $BUILD_NUMBER, commit $SHORT_COMMIT" || { detail "not build $BUILD_NUMBER, commit $SHORT_COMMIT"; return 1; }
  timeout 120 "$bin" --list-devices >"$STEP_DIR/list-devices.txt" 2>&1 || true
  detail "--list-devices: $(tr '\n' ' ' <"$STEP_DIR/list-devices.txt" | cut -c1-600)"
  grep -q "CUDA0" "$STEP_DIR/list-devices.txt" || { detail "no CUDA0 in --list-devices"; return 1; }
  grep -q "$EXPECT_GPU_NAME" "$STEP_DIR/list-devices.txt" || { detail "CUDA0 is not $EXPECT_GPU_NAME"; return 1; }
}
s_image_offload() {
  image_env
  # shellcheck disable=SC1091
  source "$WORK/gpu.env"
  local rc=0 args=(--binary "$WORK/image-llama-server" --models "$DEVICE_DIR/models"
    --log "$OUT/server-image-offload.log" --out "$STEP_DIR/data.json" --expect on-gpu
    --ready-timeout "${IMAGE_READY_TIMEOUT:-240}" --budget-mib "$GPU_MEM")
  "$PYTHON" "$REPO/tests/gpu/offload.py" "${args[@]}" >"$STEP_DIR/out.txt" 2>&1 || rc=$?
  sed 's/^/    /' "$STEP_DIR/out.txt"
  detail "$(tail -1 "$STEP_DIR/out.txt")"
  return "$rc"
}

# ------------------------------------------------------------------------------------------------ build
s_bundle_verify() {
  "$PYTHON" "$REPO/tests/gpu/make_bundle.py" verify --bundle-dir "$DEVICE_DIR" --dest "$WORK/src" \
    >"$STEP_DIR/data.json"
  detail "$(cat "$STEP_DIR/data.json")"
}

s_cuda_env() {
  [ -z "$LLAMA_SERVER_BIN" ] || skip "LLAMA_SERVER_BIN given: no build"
  [ "$GPU" = 1 ] || skip "no GPU: a CPU build needs no CUDA"
  local rc=0
  "$PYTHON" "$REPO/tests/gpu/cuda_env.py" --work "$WORK" >"$STEP_DIR/data.json" || rc=$?
  detail "$("$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("ok","error","cublas","cudart","cuda_driver","cmake_args")})' <"$STEP_DIR/data.json")"
  return "$rc"
}

s_build() {
  [ -z "$LLAMA_SERVER_BIN" ] || skip "LLAMA_SERVER_BIN given: $LLAMA_SERVER_BIN"
  [ "$BUILD" = 1 ] || skip "BUILD=$BUILD: no build (the image's binary is still checked)"
  local src="$WORK/src/llama.cpp" build="$WORK/build" flags=() extra=() t0 t1 t2 rc=0 left
  if [ "$GPU" = 1 ]; then
    mapfile -t flags < <("$PYTHON" "$REPO/tests/gpu/make_bundle.py" flags --bundle-dir "$DEVICE_DIR" --cuda-arch "$CUDA_ARCH")
    mapfile -t extra < <("$PYTHON" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["cmake_args"]))' \
      "$WORK/steps/cuda-env/data.json")
    local ld
    ld=$("$PYTHON" -c 'import json,sys; print(":".join(json.load(open(sys.argv[1])).get("ld_library_path", [])))' \
      "$WORK/steps/cuda-env/data.json")
    [ -z "$ld" ] || echo "export LD_LIBRARY_PATH=\"$ld\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" >"$WORK/runtime.env"
  else
    mapfile -t flags < <("$PYTHON" "$REPO/tests/gpu/make_bundle.py" flags --bundle-dir "$DEVICE_DIR")
  fi
  rm -rf "$build"
  detail "cmake -G $GENERATOR ${flags[*]} ${extra[*]}"
  t0=$(date +%s.%N)
  {
    echo "=================== configure ($(date -u +%T))"
    timeout "$BUILD_TIMEOUT" cmake -S "$src" -B "$build" -G "$GENERATOR" "${flags[@]}" "${extra[@]}" 2>&1
  } >>"$OUT/build.log" || { detail "configure failed: see build.log"; return 1; }
  t1=$(date +%s.%N)
  left=$(awk -v a="$t0" -v b="$t1" -v t="$BUILD_TIMEOUT" 'BEGIN { printf "%d\n", t - (b - a) }')
  {
    echo "=================== build llama-server -j$BUILD_JOBS, at most ${left}s ($(date -u +%T))"
    timeout --kill-after=10 "$left" cmake --build "$build" --config Release --target llama-server -j"$BUILD_JOBS" 2>&1 ||
      rc=$?
    echo "=================== build rc $rc"
  } >>"$OUT/build.log"
  t2=$(date +%s.%N)
  "$PYTHON" - "$build" "$t0" "$t1" "$t2" "$rc" "$GENERATOR" "$BUILD_JOBS" "$CUDA_ARCH" "$GPU" \
    >"$STEP_DIR/data.json" <<'EOF'
import json, os, sys
build, t0, t1, t2, rc, generator, jobs, arch, gpu = sys.argv[1:]
t0, t1, t2 = float(t0), float(t1), float(t2)
data = {"configure_seconds": round(t1 - t0, 1), "build_seconds": round(t2 - t1, 1), "rc": int(rc),
        "generator": generator, "jobs": int(jobs), "cuda_architectures": arch if gpu == "1" else None}
log = os.path.join(build, ".ninja_log")
if os.path.exists(log):  # per-object wall times: where a faster build would come from
    rows = [l.split("\t") for l in open(log).read().splitlines()[1:] if l.count("\t") == 4]
    objs = sorted(((int(e) - int(s)) / 1000, t) for s, e, _, t, _ in rows)
    data["objects"] = len(objs)
    data["object_seconds_total"] = round(sum(d for d, _ in objs), 1)
    data["cuda_object_seconds_total"] = round(sum(d for d, t in objs if ".cu.o" in t), 1)
    data["slowest_objects"] = [[round(d, 1), t] for d, t in objs[-15:][::-1]]
binary = os.path.join(build, "bin", "llama-server")
if os.path.exists(binary):
    data["binary_bytes"] = os.path.getsize(binary)
print(json.dumps(data, indent=1))
EOF
  detail "$("$PYTHON" -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("configure_seconds","build_seconds","rc","objects","object_seconds_total","cuda_object_seconds_total","binary_bytes")})' <"$STEP_DIR/data.json")"
  [ "$rc" -eq 0 ] || { detail "build failed or timed out (rc $rc): see build.log"; return 1; }
  cp "$build/bin/llama-server" "$WORK/llama-server"
}

s_binary() {
  local bin
  if [ -n "$LLAMA_SERVER_BIN" ]; then
    bin=$LLAMA_SERVER_BIN
  elif [ "$(status_of build)" = pass ]; then
    bin="$WORK/llama-server"
  elif [ "$BUILD" != 1 ] && [ "$(status_of image-binary)" = pass ]; then
    bin="$WORK/image-llama-server" # BUILD=0: the smoke test and the offload checks run the image's binary
    cp "$WORK/image.env" "$WORK/runtime.env"
  elif [ "$BUILD" != 1 ]; then
    skip "BUILD=$BUILD, no LLAMA_SERVER_BIN and no image binary: nothing to smoke-test"
  else
    detail "no binary: build $(status_of build) and no LLAMA_SERVER_BIN"
    return 1
  fi
  echo "$bin" >"$WORK/server-bin"
  # shellcheck disable=SC1091
  [ ! -f "$WORK/runtime.env" ] || source "$WORK/runtime.env"
  ldd "$bin" >"$STEP_DIR/ldd.txt" 2>&1 || true
  local version
  version=$("$bin" --version 2>&1 | tr '\n' ' ')
  detail "$bin: $version"
  detail "libraries: $(grep -oE '(libcuda|libcudart|libcublas|libcublasLt|libgomp)[^ ]* => [^ ]+' "$STEP_DIR/ldd.txt" | tr '\n' ' ')"
  if grep -q "not found" "$STEP_DIR/ldd.txt"; then detail "missing: $(grep 'not found' "$STEP_DIR/ldd.txt" | xargs)"; return 1; fi
  echo "$version" | grep -q "build $BUILD_NUMBER, commit $SHORT_COMMIT" ||
    { detail "not build $BUILD_NUMBER, commit $SHORT_COMMIT"; return 1; }
}

s_smoke() {
  # shellcheck disable=SC1091
  [ ! -f "$WORK/runtime.env" ] || source "$WORK/runtime.env"
  local args=(--binary "$(cat "$WORK/server-bin")" --models "$DEVICE_DIR/models" --log "$OUT/server.log"
    --out "$STEP_DIR/data.json" --expect-build "b$BUILD_NUMBER-$SHORT_COMMIT")
  if [ "$GPU" = 1 ]; then
    # shellcheck disable=SC1091
    source "$WORK/gpu.env"
    args+=(--gpu --budget-mib "$GPU_MEM")
  fi
  local rc=0
  "$PYTHON" "$REPO/tests/gpu/smoke.py" "${args[@]}" >"$STEP_DIR/out.txt" 2>&1 || rc=$?
  sed 's/^/    /' "$STEP_DIR/out.txt"
  detail "$(tail -1 "$STEP_DIR/out.txt")"
  return "$rc"
}

# The rollout's offload check (module_utils/gpu_offload.py) on the same binary, twice: as is, on the GPU (must pass),
# and with CUDA_VISIBLE_DEVICES= (the server serves on the CPU: must be refused, naming the cause). Without a GPU the
# binary is a CPU build, which must be refused too. Each server's whole log: $OUT/server-offload-{gpu,cpu}.log.
offload_check() { # MODE: gpu | cpu
  local mode=$1 rc=0
  # shellcheck disable=SC1091
  [ ! -f "$WORK/runtime.env" ] || source "$WORK/runtime.env"
  local args=(--binary "$(cat "$WORK/server-bin")" --models "$DEVICE_DIR/models" --log "$OUT/server-offload-$mode.log"
    --out "$STEP_DIR/data.json")
  if [ "$GPU" = 1 ]; then
    # shellcheck disable=SC1091
    source "$WORK/gpu.env"
    args+=(--budget-mib "$GPU_MEM")
  fi
  if [ "$mode" = gpu ]; then
    args+=(--expect on-gpu)
  else
    args+=(--expect refused --hide-gpu)
  fi
  [ "$GPU" != 1 ] || args+=(--gpu-metrics-out "$OUT/gpu-metrics-serving-$mode.prom")
  rm -f "$OUT/server-offload-$mode.log"
  "$PYTHON" "$REPO/tests/gpu/offload.py" "${args[@]}" >"$STEP_DIR/out.txt" 2>&1 || rc=$?
  sed 's/^/    /' "$STEP_DIR/out.txt"
  detail "$(tail -1 "$STEP_DIR/out.txt")"
  return "$rc"
}
s_offload_gpu() {
  [ "$GPU" = 1 ] || skip "no GPU: nothing to offload to"
  offload_check gpu
}
s_offload_cpu() { offload_check cpu; }

# ------------------------------------------------------------------------------------------------ report
# The device tool brings back at most eight files: the servers' logs and the GPU samples travel as two tarballs.
pack_outputs() {
  local logs=() samples=() f
  for f in "$OUT"/server*.log; do [ -f "$f" ] && logs+=("$(basename "$f")"); done
  for f in "$OUT"/*.prom "$OUT/nvidia-smi-query.txt"; do [ -f "$f" ] && samples+=("$(basename "$f")"); done
  if [ ${#logs[@]} -gt 0 ]; then tar -C "$OUT" -czf "$OUT/server-logs.tar.gz" "${logs[@]}" && (cd "$OUT" && rm -f "${logs[@]}"); fi
  if [ ${#samples[@]} -gt 0 ]; then tar -C "$OUT" -czf "$OUT/gpu-metrics.tar.gz" "${samples[@]}" && (cd "$OUT" && rm -f "${samples[@]}"); fi
}

# $OUT/gpu-report.json is rewritten after every step, so a run stopped from outside still leaves one.
write_report() { # [1: the final one: prints the summary, exits 1 when a step failed]
  REPORT_FINAL=${1:-0} "$PYTHON" - "${STEPS[@]}" <<'EOF'
import json, os, sys, time
work, out = os.environ["WORK"], os.environ["OUT"]
def read(name, file, default=None):
    path = os.path.join(work, "steps", name, file)
    return open(path).read().strip() if os.path.exists(path) else default
steps, data = [], {}
for name in sys.argv[1:]:
    started = os.path.isdir(os.path.join(work, "steps", name))
    status = read(name, "status", "running" if started else "not run")
    steps.append({"name": name, "status": status, "seconds": float(read(name, "seconds", "0")),
                  "rc": int(read(name, "rc", "0") or 0), "detail": read(name, "detail", "")})
    if read(name, "data.json"):
        try:
            data[name] = json.loads(read(name, "data.json"))
        except ValueError as exc:
            data[name] = {"unparsable": str(exc)}
smoke = data.get("smoke", {})
report = {
    "ok": all(s["status"] != "fail" for s in steps),
    "started": os.environ["RUN_STARTED"],
    "wall_seconds": round(time.time() - float(os.environ["RUN_T0"]), 1),
    "settings": {k: os.environ.get(k) for k in ("GPU", "CUDA_ARCH", "BUILD_JOBS", "BUILD_TIMEOUT", "GENERATOR",
                                                  "LLAMA_SERVER_BIN", "EXPECT_GPU_NAME", "EXPECT_VRAM_MIB",
                                                  "EXPECT_CC", "EXPECT_DRIVER", "PYTHON")},
    "summary": {
        "passed": [s["name"] for s in steps if s["status"] == "pass"],
        "failed": [s["name"] for s in steps if s["status"] == "fail"],
        "skipped": {s["name"]: s["detail"].splitlines()[-1] if s["detail"] else "" for s in steps if s["status"] == "skip"},
        "gpu": data.get("gpu-facts"),
        "build": {k: data.get("build", {}).get(k) for k in ("configure_seconds", "build_seconds", "generator", "jobs",
                                                             "cuda_architectures", "objects")},
        "smoke_checks": {c["name"]: c["status"] for c in smoke.get("checks", [])},
        "estimate_vs_log": smoke.get("estimate_vs_log"),
        "offload": {name: {k: (data.get(name) or {}).get("verdict", {}).get(k) for k in ("on_gpu", "cause", "message")}
                    for name in ("offload-gpu", "offload-cpu") if name in data},
    },
    "steps": steps,
    "data": data,
}
with open(os.path.join(out, "gpu-report.json"), "w") as handle:
    json.dump(report, handle, indent=1, default=str)
if os.environ.get("REPORT_FINAL") != "1":
    sys.exit(0)
print("\n=== summary (" + os.path.join(out, "gpu-report.json") + f", {report['wall_seconds']} s)")
for s in steps:
    last = s["detail"].splitlines()[-1] if s["detail"] else ""
    print(f"  {s['status']:5} {s['seconds']:7.1f}s  {s['name']:24} {last[:110]}")
print("  RESULT:", "PASS" if report["ok"] else "FAIL")
sys.exit(0 if report["ok"] else 1)
EOF
}

# ------------------------------------------------------------------------------------------------ the run
step host "" s_host
step bundle-verify "" s_bundle_verify
step gpu-facts "" s_gpu_facts
step cuda-env "" s_cuda_env
if [ -n "$LLAMA_SERVER_BIN" ]; then
  step build "" s_build
elif [ "$GPU" = 1 ]; then
  step_bg build "bundle-verify cuda-env" s_build # compiles while the Ansible/testinfra checks run
else
  step_bg build "bundle-verify" s_build
fi
step gpu-metrics "" s_gpu_metrics
step image-binary "cuda-env" s_image_binary
step wheels "" s_wheels
if [ -d "$WORK/site" ] && [ "$(status_of wheels)" = pass ]; then
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# the image's binary serves while the build compiles (its sm 86 kernels are JIT-compiled for this GPU from PTX)
step_bg image-offload "image-binary wheels" s_image_offload
step ansible-verify "gpu-facts wheels" s_ansible_verify
step ansible-verify-mismatch "gpu-facts wheels" s_ansible_mismatch
step testinfra "gpu-facts wheels" s_testinfra
[ -z "${BG_PIDS[build]:-}" ] || { echo "=== waiting for the build"; join_step build; }
[ -z "${BG_PIDS[image-offload]:-}" ] || { echo "=== waiting for the image's server"; join_step image-offload; }
step binary "" s_binary
step smoke "binary" s_smoke
step offload-gpu "binary" s_offload_gpu
step offload-cpu "binary" s_offload_cpu
pack_outputs
write_report 1
