"""A dev server with a WebSocket for the e2e tests, from the standard library only (the workspace image has no
npm registry): `python3 -c WS_SERVER MARKER [page]` listens on :3000. GET / answers the marker (with `page`: an
HTML page showing it, whose script opens a WebSocket to /ws and shows the echo, as a dev server's hot reload
connects); GET /ws upgrades and echoes text frames as `echo:<text>`."""

WS_SERVER = r"""
import base64, hashlib, signal, socketserver, struct, sys
# As PID 1 of its container, a process that does not handle SIGTERM ignores it: its Pod would take the whole
# grace period to go down (and a sandbox woken meanwhile waits for that, since its new Pod has the same name).
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
MARKER = sys.argv[1]
BODY = MARKER.encode()
if sys.argv[2:] == ["page"]:
    BODY = ('<!doctype html><html><head><title>app</title></head><body><p id="marker">' + MARKER +
            '</p><p id="ws">connecting</p><script>const s = new WebSocket("ws://" + location.host + "/ws");'
            's.onopen = () => s.send("hmr");'
            ' s.onmessage = e => { document.getElementById("ws").textContent = e.data; };'
            '</script></body></html>').encode()
KIND = b"text/html" if sys.argv[2:] == ["page"] else b"text/plain"
class Handler(socketserver.StreamRequestHandler):
    def handle(self):
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            chunk = self.rfile.readline()
            if not chunk:
                return
            head += chunk
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
        if lines[0].split()[1] != "/ws":
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + KIND + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(BODY) + BODY)
            return
        accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while True:
            b1, b2 = self.rfile.read(2)
            length = b2 & 127
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if b1 & 15 == 8:
                return
            reply = b"echo:" + data
            self.wfile.write(bytes([0x81, len(reply)]) + reply)
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
Server(("0.0.0.0", 3000), Handler).serve_forever()
"""
