#!/usr/bin/env bash
# kill -9 of pulse-pull at exact points of writing its --out file, then a
# restart. The library's test hook PULSE_TEST_KILL_AFTER_BYTES=N makes the
# process SIGKILL itself once N bytes are written (journal, in-place data,
# whole rewrites; a write that crosses N stops at N). Each round publishes a
# step, measures what the step writes (T bytes, on a copy), kills a pull of
# it at a point from 0 to T, then restarts pulse-pull against no server: the
# restart alone must leave the file holding exactly one published step (the
# old or the new), its claim matching its data, no journal and no temporary
# left; the last pull then reaches the head. Also: a pull killed in the
# middle of a whole rewrite leaks a full-size temporary that the next run
# removes, and only temporaries whose writer is gone are removed.
# Usage: pull_crash.sh BIN_DIR
source "$(dirname "$0")/lib/common.sh"
meta_of() { "$bin/pulse-inspect" "$1" 2>/dev/null | awk -v k="$2" '$1 == "metadata" && $2 == k {print $NF}'; }
publish() { "$bin/pulse-publish" --store "$work/store" --keep 30 "$@" >>"$work/pub.out" 2>&1 || bad "publish $*"; }
written() { grep '"event":"synced"' "$1" | tail -1 | sed -n 's/.*"file_bytes_written":\([0-9]*\).*/\1/p'; }
leftovers() { find "$work/w" -maxdepth 1 -name '.m.safetensors.tmp-*' -o -maxdepth 1 -name '.m.safetensors.journal' | wc -l; }

steps=16
"$bin/pulse-bench" trajectory --out "$work/traj" --params 200000 --steps $steps --seed 5 >/dev/null || exit 1
declare -a want
for s in $(seq 0 $steps); do want[$s]=$(digest_of "$(ck "$s")"); done
publish --new-key "$(ck 0)" "$(ck 1)"
key=$work/store/signing-key.pem
serve "$work/store" || exit 1
u=$url
mkdir -p "$work/w"
out=$work/w/m.safetensors
hex=$("$bin/pulse-publish" --store "$work/store" --public-key)
pull() { "$bin/pulse-pull" "$u" --out "$1" --key "$hex" --json --threads 1 --no-catchup >"$2" 2>&1; }
# A restart that only repairs: no server to sync from.
repair() { "$bin/pulse-pull" http://127.0.0.1:1 --out "$out" --key "$hex" --retries 0 --timeout 1 >"$work/repair.out" 2>&1; }

# --- finding 8: a whole rewrite killed halfway leaks a full-size temporary
PULSE_TEST_KILL_AFTER_BYTES=200000 pull "$out" "$work/first.json"
expect "the first pull (whole rewrite) is killed by the hook" 137 "$?"
[ "$(find "$work/w" -maxdepth 1 -name '.m.safetensors.tmp-*' | wc -l)" -eq 1 ] && ok ||
  bad "a killed whole rewrite leaves its temporary: $(ls -a "$work/w")"
# Temporaries of a dead writer (a pid that is not running), of a live one
# (this shell, written just now) and of another destination.
dead=4000000
while kill -0 "$dead" 2>/dev/null; do dead=$((dead + 1)); done
head -c 1000 /dev/zero >"$work/w/.m.safetensors.tmp-$dead-0-1f"
head -c 1000 /dev/zero >"$work/w/.m.safetensors.tmp-$$-0-2f"
head -c 1000 /dev/zero >"$work/w/.other.safetensors.tmp-$dead-0-3f"
repair
[ ! -e "$work/w/.m.safetensors.tmp-$dead-0-1f" ] && ok || bad "a dead writer's temporary is removed"
[ -e "$work/w/.m.safetensors.tmp-$$-0-2f" ] && ok || bad "a live writer's fresh temporary is kept"
[ -e "$work/w/.other.safetensors.tmp-$dead-0-3f" ] && ok || bad "another file's temporary is kept"
expect "the killed rewrite's temporary is removed on restart" 1 \
  "$(find "$work/w" -maxdepth 1 -name '.m.safetensors.tmp-*' | wc -l)"
rm -f "$work/w/.m.safetensors.tmp-$$-0-2f" "$work/w/.other.safetensors.tmp-$dead-0-3f"
[ ! -e "$out" ] && ok || bad "no file before a whole rewrite completed"

pull "$out" "$work/p.json"
expect "first pull" "${want[1]}" "$(digest_of "$out")"

# --- in-place steps killed at points from 0 to T bytes
held=1
s=1
ended_old=0
ended_new=0
for frac in 0 1 h4 h2 t23 t34 m1 m0 p1; do
  s=$((s + 1))
  [ $s -gt $steps ] && break
  publish --key "$key" "$(ck "$s")"
  # The same step on a copy: what it writes, and the file to go on from.
  rm -rf "$work/scratch" && mkdir -p "$work/scratch"
  cp "$out" "$work/scratch/m.safetensors"
  ino=$(stat -c %i "$work/scratch/m.safetensors")
  pull "$work/scratch/m.safetensors" "$work/scratch.json"
  t=$(written "$work/scratch.json")
  [ -n "$t" ] && [ "$t" -gt 0 ] || { bad "step $s: no write figure"; continue; }
  # In place (the pages that hold changes: at this density, most of them),
  # not a whole rewrite into a new file.
  expect "step $s: written in place" "$ino" "$(stat -c %i "$work/scratch/m.safetensors")"
  case $frac in
    h4) k=$((t / 4)) ;; h2) k=$((t / 2)) ;; t23) k=$((2 * t / 3)) ;; t34) k=$((3 * t / 4)) ;;
    m1) k=$((t - 1)) ;; m0) k=$t ;; p1) k=$((t + 1)) ;; *) k=$frac ;;
  esac
  PULSE_TEST_KILL_AFTER_BYTES=$k pull "$out" "$work/k.json"
  rc=$?
  # The hook ends the process at byte k, or at the point between the
  # journal's sync and the first write into the file (worth one byte of the
  # budget): with k > T it ends normally.
  if [ "$k" -le "$t" ]; then expect "step $s, killed after $k of $t bytes" 137 "$rc"; else
    expect "step $s: $k bytes are enough" 0 "$rc"; fi
  repair
  d=$(digest_of "$out")
  if [ "$d" = "${want[$s]}" ]; then ended_new=$((ended_new + 1)); held=$s;
  elif [ "$d" = "${want[$held]}" ]; then ended_old=$((ended_old + 1));
  else bad "step $s, kill at $k: the file holds no published step after the restart"; fi
  expect "step $s, kill at $k: the claim is the data's" "$d" "$(meta_of "$out" state_digest)"
  expect "step $s, kill at $k: the step claimed" "$held" "$(meta_of "$out" step)"
  expect "step $s, kill at $k: no journal or temporary after the restart" 0 "$(leftovers)"
  [ "$held" = "$s" ] || { cp "$work/scratch/m.safetensors" "$out"; held=$s; }
done
[ $ended_old -ge 2 ] && ok || bad "only $ended_old kills left the old step (journal torn)"
[ $ended_new -ge 2 ] && ok || bad "only $ended_new kills left the new step (journal replayed)"

# --- a torn journal and a corrupt one: dropped, the file keeps its step
held_digest=$(digest_of "$out")
printf 'PULSEJ1\n\377\377' >"$work/w/.m.safetensors.journal"
repair
expect "a torn journal is dropped" 0 "$(leftovers)"
expect "a torn journal changes nothing" "$held_digest" "$(digest_of "$out")"
grep -q "torn journal was dropped" "$work/repair.out" && ok || bad "the restart says it dropped a torn journal"

# --- the next sync goes on from the repaired step to the head
pull "$out" "$work/last.json"
expect "after the kills the pull reaches the head" "${want[$s]}" "$(digest_of "$out")"
# A clean exit leaves the journal for the file's pages to reach the disk;
# the next start retires it quietly.
repair
expect "the next start retires a clean exit's journal" 0 "$(leftovers)"
grep -q "journal" "$work/repair.out" && bad "a clean exit's journal is no news: $(cat "$work/repair.out")" || ok
expect "and the file is still the head" "${want[$s]}" "$(digest_of "$out")"

finish
