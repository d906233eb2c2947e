#!/usr/bin/env bash
# gloo_confinement.sh OBJECT — checks that the one object of libbooster compiled against Debian's
# gloo headers (src/dist/gloo_backend.cpp) defines no code of gloo's own types: every symbol it
# defines that mentions gloo:: must be standard-library code over a std::shared_ptr to a gloo type
# (whose layout depends on the standard library alone). Such code would be compiled from headers of
# another gloo revision than the one inside libtorch_cpu.so (src/dist/gloo_backend.h).
# Exit 0 when clean, 1 with the offending symbols listed, 2 when the object is missing.
set -euo pipefail
obj="${1:?usage: gloo_confinement.sh OBJECT}"
if [ ! -f "$obj" ]; then
  echo "gloo_confinement: $obj not found (build libbooster first)" >&2
  exit 2
fi
defined="$(nm -C --defined-only "$obj" | grep 'gloo::' || true)"
offending="$(printf '%s\n' "$defined" | grep -v '^$' |
  grep -Ev ' [WTt] (void )?std::(vector|_Vector_base|shared_ptr|__shared_ptr|_Sp_[a-z_]+)<std::shared_ptr<gloo::[A-Za-z_:]+>' |
  grep -Ev ' [WTt] (void )?std::(vector|_Vector_base)<std::shared_ptr<gloo::' || true)"
count="$(printf '%s\n' "$defined" | grep -c 'gloo::' || true)"
if [ -n "$offending" ]; then
  echo "gloo_confinement: $obj defines code of gloo's own types:" >&2
  printf '%s\n' "$offending" >&2
  exit 1
fi
echo "gloo_confinement: $obj defines $count symbol(s) mentioning gloo::, all std containers of shared_ptr"
