#!/usr/bin/env python3
"""plot_loss: the loss curve from train_log.json as a PNG, without matplotlib (zlib + struct).

    python3 tools/train/plot_loss.py train_log.json loss.png

Fallback for machines without matplotlib (train.py draws a labelled plot with it when it can).
x: training tokens (linear, 0 .. max); y: loss, log scale between the min and max plotted.
Blue: weighted train loss; orange: train loss on assistant turns and prose; green dots:
held-out loss on assistant turns and prose. Light grid lines at each power-of-two loss.
"""
import json
import math
import struct
import sys
import zlib

W, H, M = 800, 450, 40


def main(argv):
    log = json.load(open(argv[1]))
    st = log["steps"]
    series = [([r["tokens"] for r in st], [r["loss"] for r in st], (31, 119, 180), False),
              ([r["tokens"] for r in st], [r["loss_assist"] for r in st], (255, 127, 14), False)]
    if log.get("val"):
        bt = st[0]["tokens"] / (st[0]["step"] + 1)
        series.append(([v["step"] * bt for v in log["val"]], [v["val_loss_assist"] for v in log["val"]],
                       (44, 160, 44), True))
    xs = [x for s in series for x in s[0]]
    ys = [y for s in series for y in s[1] if y > 0]
    x1 = max(xs) or 1
    y0, y1 = math.log(min(ys)), math.log(max(ys))
    img = [[(255, 255, 255)] * W for _ in range(H)]

    def px(x, y):
        return M + (W - 2 * M) * x / x1, H - M - (H - 2 * M) * (math.log(y) - y0) / max(y1 - y0, 1e-9)

    def dot(x, y, c, r=1):
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                xi, yi = int(x) + dx, int(y) + dy
                if 0 <= xi < W and 0 <= yi < H:
                    img[yi][xi] = c

    k = -10
    while k < 10:
        v = 2.0 ** k
        if math.log(v) >= y0 and math.log(v) <= y1:
            _, yy = px(0, v)
            for x in range(M, W - M):
                img[int(yy)][x] = (220, 220, 220)
        k += 1
    for x in range(M, W - M):
        img[H - M][x] = (0, 0, 0)
    for y in range(M, H - M + 1):
        img[y][M] = (0, 0, 0)
    for sx, sy, c, dots in series:
        pts = [px(x, y) for x, y in zip(sx, sy) if y > 0]
        for i, (x, y) in enumerate(pts):
            if dots:
                dot(x, y, c, 3)
            elif i:
                xa, ya = pts[i - 1]
                n = int(max(abs(x - xa), abs(y - ya))) + 1
                for j in range(n + 1):
                    dot(xa + (x - xa) * j / n, ya + (y - ya) * j / n, c)
    raw = b"".join(b"\0" + bytes(v for p in row for v in p) for row in img)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    open(argv[2], "wb").write(png)


if __name__ == "__main__":
    main(sys.argv)
