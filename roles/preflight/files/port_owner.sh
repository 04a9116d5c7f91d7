#!/bin/sh
# Usage: port_owner.sh PORT UNIT
# Exit 0 when no process listens on TCP PORT, or only processes of systemd unit UNIT do;
# otherwise print the other listeners and exit 1.
port=$1 unit=$2
others=""
for pid in $(ss -Hltnp "sport = :$port" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
  grep -q "/$unit\$" "/proc/$pid/cgroup" 2>/dev/null && continue
  others="$others $(cat "/proc/$pid/comm" 2>/dev/null)[pid $pid]"
done
if [ -z "$others" ] && ss -Hltn "sport = :$port" | grep -q .; then
  # A listener without a visible process (another namespace or no permission) is still taken.
  [ -n "$(ss -Hltnp "sport = :$port" | grep -o 'pid=')" ] || others=" an unknown process"
fi
[ -z "$others" ] && exit 0
echo "held by$others"
exit 1
