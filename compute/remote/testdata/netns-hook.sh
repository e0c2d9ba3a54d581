#!/bin/sh
# netns-hook.sh: an Atrium provisioning hook (remote.CommandHook) whose
# "VMs" are network namespaces on this host. Each sandbox gets its own
# namespace joined to the host by a veth pair with a /30 of its own, and an
# `atrium sandbox-agent` listening inside it. The node reaches the agent
# over that link only: a real network boundary, without a hypervisor.
#
#   netns-hook.sh create    prints {"id","addr","token"}
#   netns-hook.sh destroy   stops the agent and deletes the namespace
#
# The node sets ATRIUM_SESSION, ATRIUM_FENCE and ATRIUM_SANDBOX_ID. Settings:
#   NETNS_HOOK_STATE   state directory      (default /run/atrium-netns-hook)
#   NETNS_HOOK_PREFIX  first two octets     (default 10.213)
#   NETNS_HOOK_TAG     short name prefix    (default at)
#   NETNS_HOOK_AGENT   agent command        (default "atrium sandbox-agent")
#   NETNS_HOOK_ARGS    extra agent flags    (e.g. --unsafe-no-sandbox)
#   NETNS_HOOK_ROUTES  addresses of this host the VMs may reach, e.g. the
#                      object store's (CIDRs, space-separated)
#   NETNS_HOOK_KEEP_LOGS  keep the agents' logs ($state/<id>.log) after destroy
# Needs root (ip netns), iproute2 and flock.
set -eu

state=${NETNS_HOOK_STATE:-/run/atrium-netns-hook}
prefix=${NETNS_HOOK_PREFIX:-10.213}
tag=${NETNS_HOOK_TAG:-at}
agent=${NETNS_HOOK_AGENT:-atrium sandbox-agent}
id=${ATRIUM_SANDBOX_ID:?ATRIUM_SANDBOX_ID is not set}
port=7070

# alive tells whether process $1 runs; a zombie is as good as gone (the
# host's init reaps it, if it reaps at all).
alive() {
	case "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" in
	"" | Z | X) return 1 ;;
	esac
}

case "${1:-}" in
create)
	mkdir -p "$state"
	# Allocate the next /30: sandbox n gets PREFIX.(n/64).(n%64*4 + 1..2).
	n=$(
		flock 9
		n=$(cat "$state/next" 2>/dev/null || echo 0)
		echo $((n + 1)) >"$state/next"
		echo "$n"
	) 9>"$state/lock"
	net="$prefix.$((n / 64)).$((n % 64 * 4))"
	host_ip="${net%.*}.$((${net##*.} + 1))"
	vm_ip="${net%.*}.$((${net##*.} + 2))"
	ns="$tag-$id"
	veth="${tag}h$n"
	peer="${tag}n$n"
	printf '%s %s\n' "$ns" "$veth" >"$state/$id.net"

	ip netns add "$ns"
	ip link add "$veth" type veth peer name "$peer"
	ip link set "$peer" netns "$ns"
	ip addr add "$host_ip/30" dev "$veth"
	ip link set "$veth" up
	ip -n "$ns" addr add "$vm_ip/30" dev "$peer"
	ip -n "$ns" link set "$peer" up
	ip -n "$ns" link set lo up
	# Addresses of this host the VM may reach (the object store, for
	# presigned URLs): nothing else is routed.
	for route in ${NETNS_HOOK_ROUTES:-}; do
		ip -n "$ns" route add "$route" via "$host_ip"
	done

	token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	mkdir -p "$state/$id"
	# The agent must not hold this script's stdout: the node reads it to
	# the end.
	# shellcheck disable=SC2086
	ATRIUM_AGENT_TOKEN=$token ip netns exec "$ns" $agent \
		--listen "$vm_ip:$port" --dir "$state/$id" ${NETNS_HOOK_ARGS:-} \
		</dev/null >"$state/$id.log" 2>&1 &
	echo $! >"$state/$id.pid"
	printf '{"id":"%s","addr":"%s:%d","token":"%s"}\n' "$id" "$vm_ip" "$port" "$token"
	;;
destroy)
	[ -f "$state/$id.net" ] || exit 0 # Already gone.
	read -r ns veth <"$state/$id.net"
	if [ -f "$state/$id.pid" ]; then
		pid=$(cat "$state/$id.pid")
		# A clean stop first: the agent kills its commands and removes
		# their cgroups.
		kill -TERM "$pid" 2>/dev/null || true
		kill -CONT "$pid" 2>/dev/null || true # in case it hangs stopped
		i=0
		while alive "$pid" && [ $i -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
	fi
	for pid in $(ip netns pids "$ns" 2>/dev/null); do
		kill -KILL "$pid" 2>/dev/null || true
	done
	ip netns del "$ns" 2>/dev/null || true
	ip link del "$veth" 2>/dev/null || true
	rm -rf "${state:?}/$id" "$state/$id.net" "$state/$id.pid"
	[ -n "${NETNS_HOOK_KEEP_LOGS:-}" ] || rm -f "$state/$id.log"
	;;
*)
	echo "usage: $0 create|destroy (run by atrium's remote compute provider)" >&2
	exit 2
	;;
esac
