#pragma once
// control: systemd's service notification protocol (sd_notify(3)) without
// libsystemd: one datagram of "KEY=VALUE" lines to the AF_UNIX socket named
// in $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace).
//
// sluice sends READY=1 once its shards and admin listener take connections
// (a unit with Type=notify is "started" only then), STOPPING=1 when a
// SIGTERM drain begins, and, on a binary upgrade (SIGUSR2), MAINPID=<new
// pid> from the old process once the new one serves, so that systemd
// follows the new process as the service's main one (NotifyAccess=main
// suffices: the message comes from the main process of the moment).
#include <string>
#include <string_view>

namespace sluice::control {

// Fills `addr` (a sockaddr_un) and `len` from a NOTIFY_SOCKET value.
// Returns: false for an empty, relative or too long name.
bool notify_address(std::string_view name, void* addr, unsigned& len) noexcept;

// Sends `state` to $NOTIFY_SOCKET. Returns: true when sent; false when the
// variable is unset (not a notify service: nothing to do) or the send
// failed (logged).
bool service_notify(std::string_view state) noexcept;

}  // namespace sluice::control
