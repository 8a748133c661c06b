#!/usr/bin/env bash
# A two-segment training plan lives its whole life in under a minute.
#
# 1. Buy under the manual clock, where time stands still (offerings stay valid while you read them).
# 2. Restart the same data directory under the accelerated clock: 40,000 service seconds per real
#    second, so each real second is about eleven service hours. The clock resumes where it stopped.
# Run from the repository root after `make run` has set up .venv (or `make test`).
set -euo pipefail
HP=.venv/bin/hyperplan
export HYPERPLAN_DATA_DIR=${HYPERPLAN_DATA_DIR:-$(mktemp -d)}
mkdir -p "$HYPERPLAN_DATA_DIR"  # one given that does not exist yet: the server's log goes in it
export HYPERPLAN_ENDPOINT_URL=http://127.0.0.1:${PORT:-8090}
PORT=${PORT:-8090}
export AWS_SHARED_CREDENTIALS_FILE=$HYPERPLAN_DATA_DIR/credentials AWS_PROFILE=hyperplan

serve() {
  $HP serve --port "$PORT" --log-level warning "$@" >>"$HYPERPLAN_DATA_DIR/server.log" 2>&1 &
  SERVER=$!
  until curl -fs "$HYPERPLAN_ENDPOINT_URL/healthz" >/dev/null 2>&1; do
    if ! kill -0 "$SERVER" 2>/dev/null; then  # it exited (refused to start, say): never ready
      status=0
      wait "$SERVER" || status=$?
      echo "the server exited (status $status) before it was ready; the end of its log:" >&2
      tail -n 20 "$HYPERPLAN_DATA_DIR/server.log" >&2
      exit 1
    fi
    sleep 0.2
  done
}
trap 'kill $SERVER 2>/dev/null || true' EXIT

serve --clock manual
# 16 x p5 for 10 days on a HyperPod cluster: the busy demo calendar offers it as two segments.
OFFERING=$($HP plans search --instance-type ml.p5.48xlarge --count 16 --days 10 --target hyperpod-cluster --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["TrainingPlanOfferingId"])')
$HP plans buy demo --offering-id "$OFFERING"
kill "$SERVER"; wait "$SERVER" || true

serve --clock accelerated --time-scale 40000
started=$SECONDS
while :; do
  line=$($HP plans show demo --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["Status"], [s["Status"] for s in p["ReservedCapacitySummaries"]], "-", p["StatusMessage"])')
  echo "$($HP clock show --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["Now"][:16])')  $line"
  [[ $line == Expired* ]] && break
  sleep 1
done
echo "The plan lived its whole life in $((SECONDS - started)) s of real time."
$HP plans events demo
