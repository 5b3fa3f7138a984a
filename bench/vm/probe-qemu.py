#!/usr/bin/env python3
# Stand-in QEMU: pmem: maps the backend file as QEMU does (MAP_PRIVATE, under the shim
# advm preloads) and writes the device to $FAKE_OUT; blk: converts the -drive as QEMU
# would open it (qemu-img --image-opts) to $FAKE_OUT. Then answers HTTP once ready.
import mmap, os, re, socket, subprocess, sys
argv = sys.argv[1:]
out = os.environ["FAKE_OUT"]
for a in argv:
    if a.startswith("memory-backend-file,"):
        o = dict(kv.split("=", 1) for kv in a.split(",")[1:])
        fd = os.open(o["mem-path"], os.O_RDWR)
        n = int(o["size"])
        m = mmap.mmap(fd, n, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        with open(out, "wb") as f:
            for i in range(0, n, 1 << 24):
                f.write(m[i:i + (1 << 24)])
    if a.startswith("file=") and "if=none" in a:
        parts = re.split(r"(?<!,),(?!,)", a)
        opts = []
        share = False
        for p in parts:
            k, v = p.split("=", 1)
            if k in ("if", "id", "snapshot"):
                continue
            if k == "force-share":
                share = True
                continue
            if k == "format":
                k = "driver"
            if k == "file":
                k = "file.filename"
            opts.append(f"{k}={v}")
        cmd = ["qemu-img", "convert"] + (["-U"] if share else []) + ["--image-opts", ",".join(opts), "-O", "raw", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print("fake blk:", cmd, r.stderr, file=sys.stderr)
            sys.exit(1)
port = int(re.search(r"hostfwd=tcp:127.0.0.1:(\d+)-", " ".join(argv)).group(1))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port)); s.listen()
while True:
    c, _ = s.accept(); c.recv(4096); c.sendall(b"HTTP/1.0 200 OK\r\n\r\nfake\n"); c.close()
