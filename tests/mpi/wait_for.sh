# Sourced by the expect_*.sh scripts (each defines fail MESSAGE).
# wait_for PID OUT WHAT CONDITION...: runs CONDITION every 0.2 s until it holds; when the process
# PID ends first, or 120 s pass, kills it, prints OUT (its output) and fails with WHAT.
wait_for() {
  wait_pid=$1 wait_out=$2 wait_what=$3
  shift 3
  waited=0
  until "$@"; do
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -gt 600 ] || ! kill -0 "$wait_pid" 2>/dev/null; then
      kill -9 "$wait_pid" 2>/dev/null
      cat "$wait_out"
      fail "$wait_what"
    fi
  done
}
