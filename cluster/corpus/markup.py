"""Markup to plain text for cluster/corpus/build_corpus.py: HTML, roff man pages, Texinfo, Info and POD.

Each function takes the decoded text of one file and returns its readable text (paragraphs kept,
markup and navigation dropped). They aim at clean training text, not at exact rendering: a command
that means nothing to a reader is dropped, the text around it kept. Standard library only.
"""
import html
import re
from html.parser import HTMLParser

# Elements whose content is never prose, and class/id/role words of site chrome (Sphinx, rustdoc,
# Javadoc, DocBook and Texinfo HTML all use some of them).
SKIP_TAGS = {"script", "style", "head", "nav", "header", "footer", "noscript", "svg", "button", "form", "select",
             "textarea", "template", "iframe", "object"}
CHROME = re.compile(r"\b(sidebar|sphinxsidebar|related|footer|header|navigation|navbar|nav|breadcrumbs?|toc|"
                    r"search|menu|headerlink|copyright|skip|sub-title|top-bar|rustdoc-toggle|src-link)\b", re.I)
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
BLOCK = {"p", "div", "section", "article", "main", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr", "h1", "h2",
         "h3", "h4", "h5", "h6", "pre", "blockquote", "br", "hr", "figure", "figcaption", "caption", "details",
         "summary", "aside", "body"}


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out, self.stack, self.skip, self.pre = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            if tag in ("br", "hr") and not self.skip:
                self.out.append("\n")
            return
        a = dict(attrs)
        # The page's own containers are never chrome, whatever their classes say (cppreference's body
        # is class "... cpp-navbar").
        chrome = tag not in ("html", "body", "main", "article") and bool(
            CHROME.search(" ".join(str(a.get(k) or "") for k in ("class", "id", "role"))))
        skipped = tag in SKIP_TAGS or chrome
        self.stack.append((tag, skipped))
        self.skip += skipped
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK and not self.skip:
            self.out.append("\n\n" if tag in ("p", "pre", "table", "blockquote") or tag[0] == "h" else "\n")

    def handle_startendtag(self, tag, attrs):
        if tag in ("br", "hr") and not self.skip:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if not any(t == tag for t, _ in self.stack):
            return  # an end tag without its start (or of a void element): ignored
        while self.stack:
            t, skipped = self.stack.pop()
            self.skip -= skipped
            if t == "pre":
                self.pre -= 1
            if t == tag:
                break
        if tag in BLOCK and not self.skip:
            self.out.append("\n")

    def handle_data(self, data):
        if self.skip:
            return
        self.out.append(data if self.pre else re.sub(r"\s+", " ", data))


def from_html(text):
    p = _Text()
    try:
        p.feed(text)
        p.close()
    except (AssertionError, ValueError):  # HTMLParser gives up on some malformed markup: keep what it read
        pass
    lines = [ln.strip() if not ln.startswith(" " * 4) else ln.rstrip() for ln in "".join(p.out).split("\n")]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ roff
_ROFF_ESC = [(re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""), (re.compile(r"\\s[+-]?\d"), ""),
             (re.compile(r"\\\((em|en)"), "-"), (re.compile(r"\\\((lq|rq|dq)"), '"'), (re.compile(r"\\\((oq|cq)"), "'"),
             (re.compile(r"\\\(bu"), "*"), (re.compile(r"\\\(co"), "(c)"), (re.compile(r"\\\(..|\\\[[^\]]*\]"), ""),
             (re.compile(r"\\[-]"), "-"), (re.compile(r"\\[e\\]"), "\\\\"), (re.compile(r"\\[&|^%:]"), ""),
             (re.compile(r"\\ "), " "), (re.compile(r"\\`"), "`"), (re.compile(r'\\".*$'), ""), (re.compile(r"\\\*\(..|\\\*\[[^\]]*\]|\\\*."), ""),
             (re.compile(r"\\n\(..|\\n."), ""), (re.compile(r"\\c$"), "")]
_ROFF_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "TP", "IP", "SM", "SB", "Nm", "Nd",
                     "Sh", "Ss", "It", "Dt", "Em", "Ar", "Fl", "Pa", "Xr", "Op", "Fn", "Va", "Dv", "Er", "Ev", "Cm", "Ql",
                     "Sy", "Li", "Dq", "Sq", "Pq", "Ic"}


def _roff_inline(s):
    for pat, rep in _ROFF_ESC:
        s = pat.sub(rep, s)
    return s


def from_roff(text):
    """man(7)/mdoc(7) source as text: fill-mode lines joined into paragraphs (as roff fills them),
    no-fill blocks (.nf/.EX, tbl rows) kept line by line, headings on their own lines."""
    out, para, fill, tbl = [], [], True, None

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in text.split("\n"):
        if line.startswith((".\\\"", "'\\\"")) or line.strip() in (".", "'"):
            continue
        if tbl == "spec":  # tbl's format lines, up to the one ending in '.'
            if line.rstrip().endswith("."):
                tbl = "rows"
            continue
        if line.startswith((".", "'")):
            m = re.match(r"^[.']\s*([A-Za-z]{1,3})\s*(.*)$", line)
            if not m:
                continue
            name, rest = m.group(1), m.group(2)
            if name == "TS":
                flush()
                tbl = "spec"
                continue
            if name == "TE":
                tbl = None
                continue
            if name in ("nf", "EX"):
                flush()
                fill = False
            elif name in ("fi", "EE"):
                fill = True
            if name in ("PP", "LP", "P", "sp", "br", "Pp", "Bl", "El", "RS", "RE", "TP", "IP", "HP", "It", "SH", "SS",
                        "Sh", "Ss"):
                flush()
            if name in _ROFF_TEXT_MACROS and rest:
                # Alternating-font macros join their arguments without spaces (.BR ls (1) -> "ls(1)").
                words = [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', rest)]
                joiner = "" if name in ("BR", "BI", "IB", "IR", "RB", "RI") else " "
                words = _roff_inline(joiner.join(words))
                if name in ("SH", "Sh"):
                    out += ["", words.title()]
                elif name in ("SS", "Ss"):
                    out += ["", words]
                else:
                    para.append(words)
            continue
        line = _roff_inline(line)
        if not line.strip():
            flush()
            out.append("")
        elif fill and tbl is None:
            para.append(line.strip())
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


# ------------------------------------------------------------------------------------- texinfo
_TEXI_DROP = re.compile(r"^@(c|comment|node|[a-z]*index|end|setfilename|settitle|set|clear|ifset|ifclear|iftex|"
                        r"ifinfo|ifhtml|ifnottex|ifnotinfo|ifnothtml|include|macro|rmacro|alias|page|need|vskip|"
                        r"paragraphindent|firstparagraphindent|exampleindent|syncodeindex|synindex|defcodeindex|"
                        r"defindex|printindex|contents|shortcontents|summarycontents|setchapternewpage|titlepage|"
                        r"finalout|smallbook|headings|documentencoding|documentlanguage|dircategory|direntry|menu|"
                        r"detailmenu|insertcopying|copying|dircategory|noindent|group|sp|bye|top|tex|html|"
                        r"cartouche|example|smallexample|lisp|smalllisp|display|smalldisplay|format|smallformat|"
                        r"verbatim|quotation|itemize|enumerate|table|ftable|vtable|multitable|float|caption)\b")
_TEXI_BRACE = re.compile(r"@[a-zA-Z]+\{([^{}]*)\}")
_TEXI_SIMPLE = re.compile(r"^@(chapter|section|subsection|subsubsection|unnumbered|unnumberedsec|unnumberedsubsec|"
                          r"appendix|appendixsec|appendixsubsec|heading|subheading|majorheading|chapheading|"
                          r"title|subtitle|item|itemx|deffn|defun|defmac|defvar|defopt|deftypefn|deftypefun|"
                          r"deftypevar|defvr|deftp|author|strong|center)\s+(.*)$")


def from_texinfo(text):
    # Texinfo inside `@ignore ... @end ignore` and macro bodies is not text.
    text = re.sub(r"(?ms)^@ignore\b.*?^@end ignore\s*$", "", text)
    text = re.sub(r"(?ms)^@r?macro\b.*?^@end r?macro\s*$", "", text)
    out = []
    for line in text.split("\n"):
        m = _TEXI_SIMPLE.match(line)
        if m:
            line = m.group(2)
        elif _TEXI_DROP.match(line):
            continue
        for _ in range(4):  # nested @code{@var{x}}
            line, n = _TEXI_BRACE.subn(r"\1", line)
            if not n:
                break
        line = line.replace("@@", "@").replace("@{", "{").replace("@}", "}").replace("@dots{}", "...")
        line = re.sub(r"@[a-zA-Z]+\{\}", "", line)
        line = re.sub(r"@[*/\-:.!?' ]", lambda m: {"@.": ".", "@!": "!", "@?": "?", "@ ": " ", "@*": "\n"}.get(m.group(0), ""), line)
        out.append(line)
    return "\n".join(out)


def from_info(text):
    """GNU Info: node separators (^_), node header lines and menu markers go; the text stays."""
    out = []
    for line in text.split("\n"):
        if line.startswith("\x1f") or line.startswith("File: ") and "Node:" in line:
            out.append("")
            continue
        if line.startswith(("Tag Table:", "End Tag Table", "Ref:", "Node: ")) or line.strip() == "* Menu:":
            continue
        out.append(line.replace("\x1f", ""))
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ POD
_POD_INLINE = re.compile(r"[BICFLSEXZ]<<+\s+(.*?)\s+>>+|[BICFLSXZ]<([^<>]*)>")


def _pod_inline(s):
    for _ in range(4):
        s, n = _POD_INLINE.subn(lambda m: (m.group(1) if m.group(1) is not None else m.group(2)).split("|")[0], s)
        if not n:
            break
    return s.replace("E<lt>", "<").replace("E<gt>", ">").replace("E<verbar>", "|").replace("E<sol>", "/")


def from_pod(text):
    """Perl's POD (a .pod file, or the POD blocks of a .pm/.pl are left in the code as they are)."""
    out, skip = [], False
    for line in text.split("\n"):
        if line.startswith("="):
            cmd, _, rest = line[1:].partition(" ")
            if cmd in ("begin", "for"):
                skip = cmd == "begin"
            elif cmd == "end":
                skip = False
            elif cmd.startswith("head") or cmd == "item":
                out += ["", _pod_inline(rest.strip())]
            continue
        if not skip:
            out.append(_pod_inline(line))
    return "\n".join(out)


def unescape(text):
    return html.unescape(text)
