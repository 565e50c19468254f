#!/usr/bin/env bash
# A configure that lacks a dependency stops with one line naming what is
# missing and how to provide it: on stderr CMake's header line, then ours,
# and nothing of find_package's paragraphs. Each case configures this source
# tree afresh with one dependency hidden (no CUDA, no tests: seconds each).
source "$(dirname "$0")/common.sh"
work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v cmake >/dev/null || { echo "SKIP: no cmake on PATH"; exit 77; }
rm -rf "$work" && mkdir -p "$work/empty"
failures=0 out=$work/out.txt err=$work/err.txt
try_seconds=120

# configure_refused WHAT NEEDLE... -- CMAKE_ARGS...: the configure with
# CMAKE_ARGS fails, and its stderr (blank lines aside) is exactly CMake's
# "CMake Error at CMakeLists.txt:N (message):" and one line holding every
# NEEDLE.
configure_refused() {
  local what=$1 needles=() needle lines start=$SECONDS
  shift
  while [[ $1 != -- ]]; do
    needles+=("$1")
    shift
  done
  shift
  try cmake -S "$src" -B "$work/build-$what" -DMPIFORMER_CUDA=OFF -DMPIFORMER_TESTS=OFF "$@"
  if [[ $rc -eq 0 ]]; then
    fail "$what: the configure succeeded"
    return
  fi
  mapfile -t lines < <(grep -v '^[[:space:]]*$' "$err")
  if [[ ${#lines[@]} -ne 2 ]]; then
    fail "$what: ${#lines[@]} lines on stderr, expected CMake's header and one line"
    return
  fi
  if [[ ! ${lines[0]} =~ ^CMake\ Error\ at\ CMakeLists\.txt:[0-9]+\ \(message\):$ ]]; then
    fail "$what: stderr starts with '${lines[0]}', not our message's header"
    return
  fi
  for needle in "mpiformer needs" "${needles[@]}" "(docs/INSTALL.md)"; do
    if [[ ${lines[1]} != *"$needle"* ]]; then
      fail "$what: the message does not say '$needle'"
      return
    fi
  done
  echo "PASS: $what refused in $((SECONDS - start)) s:${lines[1]}"
}

# The cases hide one piece from a configure that otherwise succeeds: where
# this machine needs hints for that (a build configured with HDF5_ROOT and
# the like), they would test nothing.
try cmake -S "$src" -B "$work/build-all" -DMPIFORMER_CUDA=OFF -DMPIFORMER_TESTS=OFF
if [[ $rc -ne 0 ]]; then
  echo "SKIP: a configure without hints fails here: $(grep -v '^[[:space:]]*$' "$err" | sed -n 2p)"
  exit 77
fi

configure_refused hdf5 "parallel (MPI) build of HDF5: none found" \
  "apt-get install libhdf5-openmpi-dev" "HDF5_ROOT" -- -DCMAKE_DISABLE_FIND_PACKAGE_HDF5=TRUE
configure_refused hdf5_root "none under HDF5_ROOT=$work/empty" -- -DHDF5_ROOT="$work/empty"
configure_refused boost "Boost 1.74 or newer with program_options" \
  "apt-get install libboost-program-options-dev" "Boost_ROOT" \
  -- -DCMAKE_DISABLE_FIND_PACKAGE_Boost=TRUE
configure_refused sentencepiece "SentencePiece C++ library" \
  "none under SentencePiece_ROOT=$work/empty" "apt-get install libsentencepiece-dev" \
  -- -DSentencePiece_ROOT="$work/empty"

# The CUDA architectures (where nvcc is there): by default the GPUs clusters
# have, sm_80 to sm_90 with sm_90's PTX; MPIFORMER_NATIVE narrows them to the
# machine's GPU (a stand-in nvidia-smi says 8.6), and keeps the default
# where no GPU answers.
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  mkdir -p "$work/gpu-bin" "$work/no-gpu-bin"
  printf '#!/bin/sh\necho 8.6\n' >"$work/gpu-bin/nvidia-smi"
  printf '#!/bin/sh\nexit 9\n' >"$work/no-gpu-bin/nvidia-smi"
  chmod +x "$work/gpu-bin/nvidia-smi" "$work/no-gpu-bin/nvidia-smi"
  for case in "default||80-real;86-real;89-real;90" "native|gpu-bin|86" \
    "native-no-gpu|no-gpu-bin|80-real;86-real;89-real;90"; do
    IFS='|' read -r name bin expected <<<"$case"
    native=OFF
    [[ $name == native* ]] && native=ON
    PATH=$work/${bin:-gpu-none}:$PATH try cmake -S "$src" -B "$work/build-cuda-$name" \
      -DMPIFORMER_TESTS=OFF -DMPIFORMER_NATIVE=$native
    if grep -q "CUDA backend: off" "$out"; then
      echo "SKIP: no CUDA backend configured here"
      break
    fi
    check "CUDA architectures, $name: $expected (exit $rc)" \
      grep -qF "CMAKE_CUDA_ARCHITECTURES $expected)" "$out"
  done
fi

exit_on_failures
