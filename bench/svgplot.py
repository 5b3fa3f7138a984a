"""SVG drawing shared by the plot scripts under bench/ (stdlib only; no matplotlib here).

A script in bench/<area>/ imports it with

    sys.dont_write_bytecode = True  # no __pycache__ in bench/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import svgplot

`Svg` is the document (white background, sans-serif 12 px, as docs/remap.svg and
docs/vm-density.svg); `bars` draws one panel of grouped bars on a linear axis that starts
at 0, with the values of each bar's runs as dots over it and reference lines across.
"""


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            'font-family="sans-serif" font-size="12">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
        ]

    def add(self, element):
        self.out.append(element)

    def text(self, x, y, s, anchor="start", size=None, fill=None, weight=None, rotate=False):
        attrs = f' text-anchor="{anchor}"' if anchor != "start" else ""
        attrs += f' font-size="{size}"' if size else ""
        attrs += f' fill="{fill}"' if fill else ""
        attrs += f' font-weight="{weight}"' if weight else ""
        if rotate:
            attrs += f' transform="rotate(-90 {x:.1f} {y:.1f})"'
        self.add(f'<text x="{x:.1f}" y="{y:.1f}"{attrs}>{esc(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#999", width=1, dash=""):
        da = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}" stroke-width="{width}"{da}/>')

    def rect(self, x, y, w, h, fill, stroke="none", opacity=None):
        op = f' fill-opacity="{opacity}"' if opacity is not None else ""
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                 f'fill="{fill}" stroke="{stroke}"{op}/>')

    def circle(self, x, y, r, fill, stroke="none"):
        self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="{stroke}"/>')

    def legend(self, x, y, entries, step=16):
        """entries: (label, colour); a swatch and the label per row, from (x, y) down."""
        for i, (label, colour) in enumerate(entries):
            self.rect(x, y + i * step - 9, 12, 10, colour)
            self.text(x + 17, y + i * step, label, size=11)

    def save(self, path):
        open(path, "w").write("\n".join(self.out + ["</svg>"]) + "\n")


def bars(svg, box, groups, series, ymax, yticks, ylabel, title="", refs=(), fmt=None,
         label_groups=(), label_series=None):
    """One panel of grouped bars.

    box: (x, y, w, h) of the plot area. groups: group labels, left to right (a label may
    hold a newline: two lines). series: (name, colour, values) with values[i] for
    groups[i]: None (no bar), a number, or (bar, [dots]) for a median bar and the values
    of its runs, or (bar, [dots], top) with top a lighter segment stacked on the bar.
    refs: (value, colour, dash, label) lines across the panel, label at their right end.
    fmt: value -> text written over the bars of the groups whose index is in
    label_groups (of the series whose index is in label_series; default all). Values above ymax are clipped at the top and written out.
    """
    x0, y0, w, h = box
    def py(v):
        return y0 + h - min(v, ymax) / ymax * h
    if title:
        svg.text(x0, y0 - 10, title, weight="bold")
    for v in yticks:
        svg.line(x0, py(v), x0 + w, py(v), stroke="#e4e4e4")
        svg.text(x0 - 6, py(v) + 4, f"{v:g}", anchor="end", size=11)
    svg.text(x0 - 42, y0 + h / 2, ylabel, anchor="middle", rotate=True)
    gw = w / len(groups)
    n = len(series)
    bw = gw * 0.8 / n
    for gi, g in enumerate(groups):
        gx = x0 + gi * gw
        for li, part in enumerate(g.split("\n")):
            svg.text(gx + gw / 2, y0 + h + 16 + 13 * li, part, anchor="middle", size=11)
        for si, (name, colour, values) in enumerate(series):
            v = values[gi]
            if v is None:
                continue
            bar, dots, top = (v, [], 0) if isinstance(v, (int, float)) else (tuple(v) + (0,))[:3]
            bx = gx + gw * 0.1 + si * bw
            svg.rect(bx + 1, py(bar), bw - 2, py(0) - py(bar), colour)
            if top:
                svg.rect(bx + 1, py(bar + top), bw - 2, py(bar) - py(bar + top), colour, opacity=0.35)
            for d in dots:
                svg.circle(bx + bw / 2, py(d), 2.2, "white", stroke="#222")
            if bar + top > ymax:
                svg.text(bx + bw / 2, y0 - 2, f"{bar + top:g}", anchor="middle", size=9)
            elif fmt and gi in label_groups and (label_series is None or si in label_series):
                svg.text(bx + bw / 2, py(max([bar + top] + dots)) - 4, fmt(bar), anchor="middle", size=9)
    svg.line(x0, y0 + h, x0 + w, y0 + h, stroke="#666")
    svg.line(x0, y0, x0, y0 + h, stroke="#666")
    for value, colour, dash, label in refs:
        svg.line(x0, py(value), x0 + w, py(value), stroke=colour, width=1.5, dash=dash)
        if label:
            svg.text(x0 + w + 4, py(value) + 4, label, size=10, fill=colour)
    return lambda gi, si, v: (x0 + gi * gw + gw * 0.1 + (si + 0.5) * bw, py(v))
