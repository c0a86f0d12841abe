# Starts s3rver (npm) on 127.0.0.1 with bucket `bkt`, data in $work/s3, log
# in $work/s3.log, and points the AWS CLI at it: sets port and
# AWS_ENDPOINT_URL (with throwaway credentials) and defines s3 (aws with
# the endpoint). Sourced after lib/common.sh by the scripts that need it,
# once they checked that s3rver and aws are there.
start_s3rver() {
  s3rver -d "$work/s3" -a 127.0.0.1 -p 0 --configure-bucket bkt >"$work/s3.log" 2>&1 &
  pids+=($!)
  wait_s3rver
}
# Waits for the server's "listening on" line; sets port and the AWS CLI's
# environment.
wait_s3rver() {
  port=
  for _ in $(seq 1 200); do
    port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { echo "FAIL: s3rver did not start"; cat "$work/s3.log"; exit 1; }
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER \
    AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null \
    AWS_SHARED_CREDENTIALS_FILE=/dev/null
}
# The same with conditional writes honoured as S3 does
# (lib/s3rver_conditional.js; S3_HEAD_DELAY_MS holds each head PUT).
start_s3rver_conditional() {
  NODE_PATH=${NODE_PATH:-$(npm root -g 2>/dev/null || echo /usr/lib/node_modules)} \
    node "$(dirname "${BASH_SOURCE[0]}")/s3rver_conditional.js" "$work/s3" >"$work/s3.log" 2>&1 &
  pids+=($!)
  wait_s3rver
}
s3() { aws --endpoint-url "$AWS_ENDPOINT_URL" "$@"; }
