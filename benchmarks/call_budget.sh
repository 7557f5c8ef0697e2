# Sourced by benchmarks/gpu.sh and benchmarks/emergence_seeds.sh. A device call has a hard limit
# (10 minutes), and a call killed by it returns nothing it has not written yet: the tarballs come
# last. So each stage runs under its own budget or under what is left of the call's, whichever is
# less, and a stage that ran long shortens the ones after it instead of sinking the call.
#
#   call_start LIMIT_S            at the call's start; an empty LIMIT_S sets no limit (a CPU's runs)
#   call_budget BUDGET_S GRACE_S  the seconds the next stage may take: its budget, cut to the time
#                                 left less the grace `timeout --kill-after` gives it; at least 1

call_start() {
  call_deadline=${1:+$(($(date +%s) + $1))}
}

call_budget() {
  local budget=$1 grace=$2 rest
  if [[ -n ${call_deadline:-} ]]; then
    rest=$((call_deadline - $(date +%s) - grace))
    ((rest < budget)) && budget=$rest
  fi
  ((budget < 1)) && budget=1
  echo "$budget"
}
