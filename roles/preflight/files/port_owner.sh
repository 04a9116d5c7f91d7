#!/bin/sh
# Usage: port_owner.sh PORT UNIT
# Exit 0 when nothing listens on TCP PORT, or only processes of systemd unit UNIT do;
# otherwise print who holds it and exit 1.
port=$1 unit=$2
listeners=$(ss -Hltnp "sport = :$port")
[ -z "$listeners" ] && exit 0

pids=$(printf '%s\n' "$listeners" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u)
if [ -z "$pids" ]; then
  # Without CAP_SYS_PTRACE (e.g. in a container) ss cannot name other users' processes:
  # then an active UNIT is taken to be the holder, since it could not run with its port taken.
  systemctl is-active --quiet "$unit" && exit 0
  echo "held by a process ss cannot name"
  exit 1
fi
others=""
for pid in $pids; do
  grep -q "/$unit\$" "/proc/$pid/cgroup" 2>/dev/null && continue
  others="$others $(cat "/proc/$pid/comm" 2>/dev/null)[pid $pid]"
done
[ -z "$others" ] && exit 0
echo "held by$others"
exit 1
