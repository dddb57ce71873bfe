"""The generated wgmma header holds exactly one instruction per declared BN value and dtype,
spelled as PTX wants it (N/2 accumulators), and refuses widths wgmma has not."""
import re

import pytest

from tunefw.templates.wgmma_ops import HEADER, declared_widths, render


def test_the_committed_header_is_the_one_the_declared_widths_generate():
    assert HEADER.read_text() == render(declared_widths()), \
        "run `python -m tunefw.templates.wgmma_ops` after changing wgmma_sm90's BN values"


def test_each_width_has_its_instruction_and_its_accumulators():
    text = render((8, 136))
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(\w+)\.\w+ ", text)
    assert shapes == [("8", "bf16"), ("8", "f16"), ("136", "bf16"), ("136", "f16")]
    assert text.count("float (&d)[68]") == 2 and '"+f"(d[67])' in text and "d[68]" not in text
    # the predicate reads the operand after the accumulators and the two descriptors
    assert "setp.ne.b32 p, %70, 0;" in text and "}, %68, %69, p, 1, 1, 0, 0;" in text


@pytest.mark.parametrize("bad", [12, 0, 264])
def test_a_width_wgmma_has_not_is_refused(bad):
    with pytest.raises(ValueError, match="multiple of 8 from 8 to 256"):
        render((64, bad))
