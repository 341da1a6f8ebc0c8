# Sourced by device-call scripts: parts of one call under a shared time budget.
#   BUDGET=570; source scripts/device_budget.sh   # (not BUDGET=570 source ...: that
#   assignment would last only while the file is read)
#   part 200 python scripts/train_speed.py ...   # skipped when less than 200 s is left
# A part is cut at its own limit, so one slow part cannot eat the ones after it; each
# prints its exit code and the seconds since the budget started.
BUDGET=${BUDGET:-570}
BUDGET_T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - BUDGET_T0) )); }
part() {  # limit, command...: run it under its limit if the budget still covers it
  local limit=$1; shift
  if (( $(left) < limit )); then echo "skipped (left $(left) s): $*" | cut -c1-150; return; fi
  timeout "$limit" "$@"; echo "[rc $? at $(( $(date +%s) - BUDGET_T0 )) s]"
}
