"""The report document renders the same blocks as Markdown and as HTML; inline code is code in both."""

from draftwise.report.doc import Doc


def test_inline_code_renders_as_code_in_html_and_stays_escaped(tmp_path):
    doc = Doc()
    doc.p("run `llama-server --spec-type ngram-mod` <here>")
    doc.table(["built-in"], [["`--spec-default`"]])
    page = doc.html("t")
    assert "<code>llama-server --spec-type ngram-mod</code> &lt;here&gt;" in page
    assert "<td><code>--spec-default</code></td>" in page and "`" not in page
    assert "`llama-server --spec-type ngram-mod`" in doc.markdown(tmp_path)
