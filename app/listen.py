"""A port a process will serve on, tried at start: taken or not this host's, it fails naming its setting.

The /metrics servers (Faust's web server in the worker, ``prometheus_client`` in the bridge, trainer and
pods) bind ``RTT_METRICS_HOST``:``RTT_METRICS_PORT`` late and fail with a bare ``OSError`` (the worker with a
page of traceback). :func:`check_listen` binds the address once, as those servers do (``SO_REUSEADDR``), and lets
it go, so that the trouble is one line naming the variable before anything else starts; :func:`hold_listen`
keeps it bound and listening for the worker's web server, which serves on that socket, so no other process
can take the port in between. :func:`listen_on` binds the same way for the extender, which says its own error;
``::`` is an IPv6 socket that takes IPv4 too. :func:`url_host` writes such a host into a URL (IPv6 in brackets).

>>> import socket
>>> with socket.create_server(("127.0.0.1", 0)) as taken:
...     check_listen("127.0.0.1", taken.getsockname()[1], "RTT_METRICS_PORT")
Traceback (most recent call last):
...
app.errors.ConfigError: RTT_METRICS_PORT: cannot listen on 127.0.0.1:...: Address already in use
>>> check_listen("127.0.0.1", 0, "RTT_METRICS_PORT")  # 0: no server, nothing to try
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from app.errors import ConfigError


def url_host(host: str) -> str:
    """``host`` as the host part of a URL: an IPv6 address (with its ``%zone``, IPv4-mapped too) in brackets,
    anything else as it is -- a name, an IPv4 address, ``host:port``, an address already in brackets.

    >>> url_host("::1"), url_host("fd00:10::7"), url_host("fe80::1%eth0"), url_host("::ffff:10.0.0.7")
    ('[::1]', '[fd00:10::7]', '[fe80::1%eth0]', '[::ffff:10.0.0.7]')
    >>> url_host("10.0.0.7"), url_host("node-1"), url_host("[::1]"), url_host("10.0.0.7:9100"), url_host("u:p")
    ('10.0.0.7', 'node-1', '[::1]', '10.0.0.7:9100', 'u:p')
    """
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    return f"[{host}]" if address.version == 6 else host


def listen_error(field: str, host: str, port: int, exc: OSError, host_field: str | None = None) -> ConfigError:
    """The error of a server that could not bind ``host:port``, naming ``field`` (a variable or a flag), or
    ``host_field`` when the host is what failed (it does not resolve, or is not an address of this machine).

    >>> listen_error("RTT_METRICS_PORT", "x.invalid", 9102, socket.gaierror(-2, "Name or service not known"),
    ...              "RTT_METRICS_HOST")
    ConfigError('RTT_METRICS_HOST: cannot listen on x.invalid:9102: Name or service not known')
    """
    if host_field is not None and (isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL):
        field = host_field
    return ConfigError(field, f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def check_host(host: str, field: str) -> None:
    """That ``host`` is an address of this machine to listen on (it resolves, it is this host's): a port the OS
    picks is bound once and let go; :class:`ConfigError` naming ``field`` when that fails.

    >>> check_host("nonexistent.invalid", "--host")
    Traceback (most recent call last):
    ...
    app.errors.ConfigError: --host: cannot listen on nonexistent.invalid: ...
    """
    try:
        _bind(host, 0)
    except OSError as exc:
        raise ConfigError(field, f"cannot listen on {host}: {exc.strerror or exc}") from None


def _bind(host: str, port: int, keep: bool = False, backlog: int = 128) -> socket.socket | None:
    # socket.create_server would do, but it needs the family given and its errors carry the address a second time
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and socket.has_dualstack_ipv6():  # "::" takes IPv4 too, whatever the OS default
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        if keep:
            sock.listen(backlog)
            return sock
    except BaseException:
        sock.close()
        raise
    sock.close()
    return None


def listen_on(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A socket bound to ``host:port`` and listening, of the family ``host`` is (``::`` an IPv6 socket that takes
    IPv4 too where the OS allows, ``0.0.0.0`` or ``""`` IPv4); port 0 is one the OS picks. ``OSError`` when it
    cannot be bound (``socket.gaierror`` for a host that does not resolve); the caller closes it.

    >>> with listen_on("127.0.0.1", 0) as sock:
    ...     sock.family.name, sock.getsockname()[1] > 0
    ('AF_INET', True)
    """
    sock = _bind(host, port, keep=True, backlog=backlog)
    assert sock is not None
    return sock


def hold_listen(host: str, port: int, field: str, host_field: str | None = None) -> socket.socket | None:
    """A socket bound to ``host:port`` and listening, for a server that would otherwise bind it late (the worker's
    Faust web server): nothing can take the port between this check and that server's start. :class:`ConfigError`
    naming ``field`` when it cannot be bound; None for ``port`` 0 (no server). The caller closes it, or the server
    it is handed to does.

    >>> held = hold_listen("127.0.0.1", 0, "RTT_METRICS_PORT")
    >>> held is None
    True
    """
    if port <= 0:
        return None
    try:
        return listen_on(host, port)
    except OSError as exc:
        raise listen_error(field, host, port, exc, host_field) from None


def check_listen(host: str, port: int, field: str, host_field: str | None = None) -> None:
    """Bind ``host:port`` and let it go; :class:`ConfigError` naming ``field`` when that fails (the port is
    taken), or ``host_field``, when given, for a host that is not this machine's or does not resolve. Nothing for
    ``port`` 0 (no server)."""
    if port <= 0:
        return
    try:
        _bind(host, port)
    except OSError as exc:  # socket.gaierror included: a host that does not resolve
        raise listen_error(field, host, port, exc, host_field) from None
