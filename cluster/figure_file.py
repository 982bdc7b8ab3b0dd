"""Writing a matplotlib figure the way every hydra plot script does (plot_niah.py, plot_heads.py,
plot_train.py, plot_sweep.py): in the format its file name says (.png, .svg, .pdf, ...), under a
temporary name beside it that keeps that extension, renamed into place when complete, so a reader
never sees half a file and an .svg holds SVG (at 6777ccb the temporary was always .png, and the
bytes of a PNG went into x.svg)."""
import os


def save_figure(fig, out, tool, dpi=150):
    """Saves `fig` to `out`; an extension matplotlib cannot write is one line naming `tool`, and exit."""
    ext = os.path.splitext(out)[1].lower().lstrip(".") or "png"
    supported = fig.canvas.get_supported_filetypes()
    if ext not in supported:
        raise SystemExit(f"{tool}: --out {out}: matplotlib cannot write .{ext} (it writes {', '.join(sorted(supported))})")
    directory = os.path.dirname(os.path.abspath(out))
    temp = os.path.join(directory, f".{os.path.basename(out)}.tmp-{os.getpid()}.{ext}")
    try:
        fig.savefig(temp, dpi=dpi, format=ext)
        os.replace(temp, out)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
