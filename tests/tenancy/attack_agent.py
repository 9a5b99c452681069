"""A hostile command agent for tests/tenancy_attacks.rs: it plays a tenant's program against the
worker's LLM gateway (the unix socket in FLEET_LLM_SOCKET), by the mode in argv[1]:

- bigbodies N SIZE: N connections at once, each POSTing a SIZE-byte JSON body (sent in 1 MiB
  chunks from one buffer, so the program itself stays small); each connection's status.
- spend: one call that asks for what raises the price (a huge max_tokens, n, a priority tier),
  one with a provider-side tool, one with an MCP connector; each call's status and body.

Its last line is {"output": ...}. Standard library only.
"""
import json
import os
import socket
import sys
import threading

SOCK = os.environ["FLEET_LLM_SOCKET"]
PATH = "/v1/messages"


def post_raw(body_len, write_body):
    """POSTs a body of body_len bytes written by write_body(sock); the status and the reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    sent = "all"
    try:
        s.connect(SOCK)
        head = (
            "POST %s HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            "anthropic-version: 2023-06-01\r\nContent-Length: %d\r\n\r\n" % (PATH, body_len)
        ).encode()
        s.sendall(head)
        try:
            write_body(s)
        except OSError as e:
            sent = "cut: %s" % e.__class__.__name__
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
            if is_complete(data):
                break
        status = int(data.split(b" ")[1]) if data.startswith(b"HTTP/") else None
        reply = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
        return {"status": status, "sent": sent, "reply": reply.decode("utf-8", "replace")[:500]}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"status": None, "sent": sent, "error": repr(e)}
    finally:
        s.close()


def is_complete(data):
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def big_body(size):
    # Valid JSON asking for a stream: the old gateway read and parsed it whole before refusing.
    prefix = b'{"stream": true, "max_tokens": 16, "messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    filler = size - len(prefix) - len(suffix)
    chunk = b"x" * (1 << 20)

    def write(s):
        s.sendall(prefix)
        left = filler
        while left > 0:
            n = min(left, len(chunk))
            s.sendall(chunk[:n])
            left -= n
        s.sendall(suffix)

    return size, write


def bigbodies(n, size):
    results = [None] * n

    def one(i):
        results[i] = post_raw(*big_body(size))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"results": results}


def call(body):
    raw = json.dumps(body).encode()
    result = post_raw(len(raw), lambda s: s.sendall(raw))
    try:
        result["body"] = json.loads(result.pop("reply") or "{}")
    except ValueError:
        pass
    return result


def spend():
    msgs = [{"role": "user", "content": "hello"}]
    return {
        "pricey": call({"model": "the-priciest", "max_tokens": 1000000, "n": 8,
                        "service_tier": "priority", "messages": msgs}),
        "server_tool": call({"max_tokens": 16, "messages": msgs,
                             "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        "mcp": call({"max_tokens": 16, "messages": msgs,
                     "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}),
    }


def main():
    json.load(sys.stdin)
    mode = sys.argv[1]
    if mode == "bigbodies":
        out = bigbodies(int(sys.argv[2]), int(sys.argv[3]))
    else:
        out = spend()
    print(json.dumps({"output": out}))


if __name__ == "__main__":
    main()
