#!/usr/bin/env bash
# Smoke-runs a built ebb image as docs/kubernetes.md's container quick start does (.ci/run runs it after building):
#   deploy/docker/smoke.sh [IMAGE]          IMAGE: ebb:0.1.0 unless given
# `--version` is package.json's; `ebb` is on the PATH (the worker's preStop runs it); `ebb up` with the
# OpenAI port and the admin port (the dashboard) published on loopback: a streamed chat completion
# through one, the dashboard and the fleet it shows through the other; `docker stop` drains it and it
# exits 0. Ports on the host are free ones Docker picks. Exit status 0 when all of it holds.
set -euo pipefail
image=${1:-ebb:0.1.0}
cd "$(dirname "$0")/../.."
fail() { echo "smoke: $*" >&2; exit 1; }
t0=$SECONDS

want=$(node -p 'require("./package.json").version')
got=$(docker run --rm "$image" --version)
[ "$got" = "$want" ] || fail "--version printed '$got', package.json says $want"
docker run --rm --entrypoint ebb "$image" worker --help >/dev/null || fail "'ebb worker --help' in the image failed"

token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
c=$(docker run -d -p 127.0.0.1::8000 -p 127.0.0.1::8001 -e EBB_ADMIN_TOKEN="$token" "$image" up --host 0.0.0.0 --admin-host 0.0.0.0)
follower=
cleanup() {
  [ -z "$follower" ] || kill "$follower" 2>/dev/null || true
  docker rm -f "$c" >/dev/null 2>&1 || true
}
trap cleanup EXIT
logs() { docker logs "$c" 2>&1 | tail -n 30 >&2; }

# Up once the banner is printed (its lines come after every worker is ready and the frontend listens);
# the log stream ends if the container exits first, or after 300 s (an `ebb up` that hangs).
exec 3< <(timeout 300 docker logs -f "$c" 2>&1)
follower=$!
up=
while IFS= read -r line <&3; do
  case $line in "ebb is up"*) up=1; break ;; esac
done
[ -n "$up" ] || { logs; fail "waited for 'ebb up' to print its banner; the container's log ended first (or 300 s passed)"; }
kill "$follower" 2>/dev/null || true
follower=
exec 3<&-
api=$(docker port "$c" 8000/tcp | sed -n 1p)
admin=$(docker port "$c" 8001/tcp | sed -n 1p)

answer=$(curl -sS -N --max-time 60 "http://$api/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"ebb-mock","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}') \
  || { logs; fail "the chat completion through the published port $api failed"; }
grep -q '"finish_reason":"length"' <<<"$answer" && grep -qx 'data: \[DONE\]' <<<"$answer" \
  || { logs; fail "the streamed chat completion through $api did not run to its end: $answer"; }
page=$(curl -sS --fail --max-time 30 "http://$admin/") || { logs; fail "GET / (the dashboard) through the published port $admin failed"; }
grep -qi '<html' <<<"$page" || fail "GET / through $admin is not the dashboard's page"
# The fleet is read with the admin token (without it: 401), as the dashboard reads it once given the token.
code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 30 "http://$admin/workers")
[ "$code" = 401 ] || fail "GET /workers through $admin without the admin token answered $code, not 401"
fleet=$(curl -sS --fail --max-time 30 -H "authorization: Bearer $token" "http://$admin/workers") || fail "GET /workers through $admin with the admin token failed"
grep -q '"state":"serving"' <<<"$fleet" || fail "the dashboard's fleet (GET /workers) has no serving worker: $fleet"

# docker stop is SIGTERM: ebb up drains its workers and exits 0, well inside Docker's 10 s.
docker stop "$c" >/dev/null
code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
[ "$code" = 0 ] || { logs; fail "ebb up exited $code on docker stop"; }
echo "smoke: $image ok: --version $got; chat completion via $api, dashboard via $admin; stopped cleanly ($((SECONDS - t0)) s)"
