#!/usr/bin/env bash
# `pulse-bench loco --problem text` (the default problem): next-character
# prediction on base-files' licences (/usr/share/common-licenses), small.
# The loss starts near ln 256 and falls, the same seed gives the same
# bits (data split, initial weights, every round), another seed another
# start, --text learns a named file, a missing file is a clear error (exit
# 1, its path named), and over lossy datagrams the drift over all trainer
# pairs equals the replay's. --problem text-sft pretrains first (once: the
# checkpoint is cached and reused, a damaged cache file is trained again to
# the same bits), fine-tunes on unseen text at an RL-like rate, where
# PULSELoCo sends a small part of the entries, and reports the pretraining.
# --problem text-rl starts from the same cached checkpoint (no second
# file), samples and scores continuations, and reports every method's
# held-out reward and message density (--report: a reward table and chart);
# the same seed gives the same bits. --compute fp32 and bf16 fine-tune
# that one checkpoint, each from its own start; --param standard starts
# from the same model with the scale in the weights; bad values exit 2.
# Skips (77) where the licences are missing.
# usage: bash tests/cli/loco_text.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
BENCH="$bin/pulse-bench"
[ -x "$BENCH" ] || { echo "FAIL: $BENCH is not an executable"; exit 1; }
for f in GPL-3 GPL-2 GFDL-1.3 MPL-2.0 MPL-1.1 Apache-2.0 Artistic CC0-1.0; do
  if [ ! -r "/usr/share/common-licenses/$f" ]; then
    echo "SKIP: /usr/share/common-licenses/$f is missing (base-files): no text to learn"
    exit 77
  fi
done

# Value of a JSON key in one line: a number, true/false or a short string.
json_val() {
  awk -v key="\"$2\":" '{
    i = index($0, key)
    if (i == 0) exit
    s = substr($0, i + length(key))
    if (match(s, /^(-?[0-9][0-9.eE+-]*|true|false|"[a-z0-9]*")/)) print substr(s, RSTART, RLENGTH)
  }' <<<"$1"
}
run() { "$BENCH" loco --only-pulseloco --trainers 2 --rounds 3 --inner 10 --params 30000 --json "$@"; }

# 1. The default problem is text; it learns; same seed, same bits.
run >"$work/a.json" 2>"$work/err" || bad "text run: $(cat "$work/err")"
run >"$work/b.json" 2>"$work/err" || bad "second text run: $(cat "$work/err")"
a=$(grep '^{"summary":true' "$work/a.json")
b=$(grep '^{"summary":true' "$work/b.json")
expect "problem" '"text"' "$(json_val "$a" problem)"
P=$(json_val "$a" params)
awk -v p="${P:-0}" 'BEGIN { exit !(p >= 30000 && p < 31000) }' && ok || bad "params $P for --params 30000"
awk -v n="$(json_val "$a" text_bytes)" 'BEGIN { exit !(n > 100000) }' && ok || bad "text_bytes $(json_val "$a" text_bytes)"
# ln 256 = 5.545: a random start is near it; three rounds bring it down.
start=$(json_val "$a" initial_loss)
final=$(json_val "$a" final_loss)
awk -v s="$start" 'BEGIN { exit !(s > 5.0 && s < 7.0) }' && ok || bad "initial loss $start not near ln 256"
awk -v s="$start" -v f="$final" 'BEGIN { exit !(f < s - 0.5) }' && ok || bad "loss $start -> $final: not learning"
expect "replicas identical" true "$(json_val "$a" replicas_identical)"
expect "same seed, same final loss" "$final" "$(json_val "$b" final_loss)"
expect "same seed, same bytes" "$(json_val "$a" bytes_pulseloco)" "$(json_val "$b" bytes_pulseloco)"
expect "same seed, same text digest" "$(json_val "$a" text_digest)" "$(json_val "$b" text_digest)"

# 2. Another seed: another split and start.
run --seed 2 >"$work/c.json" 2>"$work/err" || bad "seed 2: $(cat "$work/err")"
c=$(grep '^{"summary":true' "$work/c.json")
[ "$(json_val "$c" initial_loss)" != "$start" ] && ok || bad "seed 2 starts where seed 1 does"

# 3. --text FILE; a missing one is an error naming it, before any trainer.
head -c 20000 /usr/share/common-licenses/GPL-3 >"$work/small.txt"
run --text "$work/small.txt" >"$work/d.json" 2>"$work/err" || bad "--text: $(cat "$work/err")"
expect "--text bytes" 20000 "$(json_val "$(grep '^{"summary":true' "$work/d.json")" text_bytes)"
run --text "$work/missing.txt" >"$work/out" 2>"$work/err"
expect "missing text exit status" 1 "$?"
grep -q "missing.txt" "$work/err" && ok || bad "missing text: the error does not name the file: $(cat "$work/err")"
[ ! -s "$work/out" ] && ok || bad "missing text printed to stdout"

# 4. Lossy datagrams: the drift over all pairs (every trainer's replica
# before re-sync) is the replay's, every round, and under the budget.
"$BENCH" loco --only-pulseloco --trainers 3 --rounds 3 --inner 5 --params 30000 --transport udp \
  --drop 0.2 --json >"$work/e.json" 2>"$work/err" || bad "udp text run: $(cat "$work/err")"
e=$(grep '^{"summary":true' "$work/e.json")
expect "rounds with pairwise drift" 3 "$(json_val "$e" drift_rounds_measured)"
expect "pairwise drift = the replay's" "$(json_val "$e" max_replay_drift)" "$(json_val "$e" max_drift)"
awk -v d="$(json_val "$e" max_drift)" -v b="$(json_val "$e" drift_budget)" 'BEGIN { exit !(d > 0 && d <= b) }' &&
  ok || bad "max drift $(json_val "$e" max_drift) not in (0, budget]"
expect "udp replicas identical" true "$(json_val "$e" replicas_identical)"

# 5. Text SFT: pretrained once (the cache in PULSE_CACHE_DIR), then the
# same bits from the cache; a damaged cache file is trained again.
export PULSE_CACHE_DIR="$work/cache"
sft() { "$BENCH" loco --problem text-sft --trainers 2 --rounds 3 --inner 10 --params 30000 --json "$@"; }
sft >"$work/f.json" 2>"$work/err" || bad "text-sft run: $(cat "$work/err")"
f=$(grep '^{"summary":true' "$work/f.json")
grep -q '"problem":"text-sft"' <<<"$f" && ok || bad "the summary does not say problem text-sft"
expect "pretrain steps" 3000 "$(json_val "$f" pretrain_steps)"
expect "start = the pretrained checkpoint" "$(json_val "$f" pretrain_loss)" "$(json_val "$f" initial_loss)"
# Pretrained: well below ln 256; fine-tuned at an RL-like rate, PULSELoCo
# sends a small part of the entries.
awk -v l="$(json_val "$f" pretrain_loss)" 'BEGIN { exit !(l > 0 && l < 3.5) }' && ok ||
  bad "pretrained loss $(json_val "$f" pretrain_loss)"
awk -v d="$(json_val "$f" density_pulseloco)" 'BEGIN { exit !(d > 0 && d < 0.2) }' && ok ||
  bad "text-sft density $(json_val "$f" density_pulseloco): not the sparse regime"
cached=$(ls "$PULSE_CACHE_DIR"/text-pretrained-*.bin 2>/dev/null | wc -l)
expect "one cached checkpoint" 1 "$cached"
sft >"$work/g.json" 2>"$work/err" || bad "text-sft from the cache: $(cat "$work/err")"
g=$(grep '^{"summary":true' "$work/g.json")
expect "cached: same pretrained loss" "$(json_val "$f" pretrain_loss)" "$(json_val "$g" pretrain_loss)"
expect "cached: same final loss" "$(json_val "$f" final_loss)" "$(json_val "$g" final_loss)"
for c in "$PULSE_CACHE_DIR"/text-pretrained-*.bin; do truncate -s 1000 "$c"; done
sft >"$work/h.json" 2>"$work/err" || bad "text-sft over a damaged cache: $(cat "$work/err")"
h=$(grep '^{"summary":true' "$work/h.json")
expect "damaged cache: trained again, same bits" "$(json_val "$f" final_loss)" "$(json_val "$h" final_loss)"

# 6. Text RL: the text-sft checkpoint, every method's reward and density.
rl() { "$BENCH" loco --problem text-rl --trainers 2 --rounds 3 --inner 5 --params 30000 --json "$@"; }
rl --report "$work/rl-report" >"$work/i.json" 2>"$work/err" || bad "text-rl run: $(cat "$work/err")"
rl >"$work/j.json" 2>"$work/err" || bad "second text-rl run: $(cat "$work/err")"
i=$(grep '^{"summary":true' "$work/i.json")
j=$(grep '^{"summary":true' "$work/j.json")
grep -q '"problem":"text-rl"' <<<"$i" && ok || bad "the summary does not say problem text-rl"
expect "text-rl: text-sft's checkpoint" "$(json_val "$f" pretrain_loss)" "$(json_val "$i" initial_loss)"
expect "text-rl: no second checkpoint" 1 "$(ls "$PULSE_CACHE_DIR"/text-pretrained-*.bin 2>/dev/null | wc -l)"
# 4-byte continuations: a reward in (0, 4) at the start and for every method.
for k in initial_reward reward_ddp_fp32 reward_diloco_bf16 reward_diloco_fp32 reward_pulseloco; do
  awk -v r="$(json_val "$i" $k)" 'BEGIN { exit !(r > 0 && r < 4) }' && ok || bad "$k $(json_val "$i" $k)"
done
expect "dense methods' density" 1.00000 "$(json_val "$i" density_diloco_bf16)"
awk -v d="$(json_val "$i" density_pulseloco)" 'BEGIN { exit !(d > 0 && d < 0.2) }' && ok ||
  bad "text-rl density $(json_val "$i" density_pulseloco): not the sparse regime"
grep -q '"target_reward_1pct_diloco_bf16":' <<<"$i" && ok || bad "no reward target in the summary"
expect "text-rl replicas identical" true "$(json_val "$i" replicas_identical)"
expect "--report: a reward row per round" 4 "$(wc -l <"$work/rl-report/rewards.csv")"
grep -q "Held-out expected reward" "$work/rl-report/report.html" && ok || bad "--report: no reward chart"
expect "text-rl: same seed, same reward" "$(json_val "$i" reward_pulseloco)" "$(json_val "$j" reward_pulseloco)"
expect "text-rl: same seed, same bytes" "$(json_val "$i" bytes_pulseloco)" "$(json_val "$j" bytes_pulseloco)"
expect "text-rl: same seed, same DiLoCo reward" "$(json_val "$i" reward_diloco_bf16)" "$(json_val "$j" reward_diloco_bf16)"

# 7. --compute: both modes fine-tune the one cached checkpoint, each from
# its own held-out loss (bf16: of the rounded weights); --param standard
# is the same model with the scale in the weights; bad values exit 2.
one() { "$BENCH" loco --only-pulseloco --problem text-rl --trainers 2 --rounds 1 --inner 2 --params 30000 --json "$@"; }
one --compute fp32 >"$work/k.json" 2>"$work/err" || bad "--compute fp32: $(cat "$work/err")"
one --compute bf16 >"$work/l.json" 2>"$work/err" || bad "--compute bf16: $(cat "$work/err")"
one --compute fp32 --param standard >"$work/m.json" 2>"$work/err" || bad "--param standard: $(cat "$work/err")"
k=$(grep '^{"summary":true' "$work/k.json")
l=$(grep '^{"summary":true' "$work/l.json")
m=$(grep '^{"summary":true' "$work/m.json")
expect "--compute fp32" '"fp32"' "$(json_val "$k" compute)"
expect "--compute bf16" '"bf16"' "$(json_val "$l" compute)"
expect "--param standard" '"standard"' "$(json_val "$m" param)"
expect "fp32: its start is its pretrain_loss" "$(json_val "$k" pretrain_loss)" "$(json_val "$k" initial_loss)"
expect "bf16: its start is its pretrain_loss" "$(json_val "$l" pretrain_loss)" "$(json_val "$l" initial_loss)"
[ "$(json_val "$l" initial_loss)" != "$(json_val "$k" initial_loss)" ] && ok ||
  bad "bf16 and fp32 compute start from the same loss: nothing rounded"
awk -v a="$(json_val "$k" initial_loss)" -v b="$(json_val "$m" initial_loss)" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d < 1e-4 * a) }' && ok ||
  bad "--param standard starts at $(json_val "$m" initial_loss), scaled at $(json_val "$k" initial_loss)"
expect "--compute and --param: still one checkpoint" 1 "$(ls "$PULSE_CACHE_DIR"/text-pretrained-*.bin 2>/dev/null | wc -l)"
"$BENCH" loco --compute fp16 >/dev/null 2>"$work/err"
expect "--compute fp16 exit status" 2 "$?"
"$BENCH" loco --param standard --problem teacher >/dev/null 2>"$work/err"
expect "--param standard on teacher exit status" 2 "$?"
unset PULSE_CACHE_DIR

echo "$test_name: $pass passed, $failures failed"
[ "$failures" -eq 0 ]
