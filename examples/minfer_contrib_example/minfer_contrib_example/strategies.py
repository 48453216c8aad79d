"""The example pass's target strategy, for minfer's property suite only (it imports hypothesis).

`passes.PASS` names it as ``patterns="minfer_contrib_example.strategies:scaled_tanh_graphs"``:
the suite imports this module when it checks the pass; loading the plugin never does.
"""

from hypothesis import strategies as st

from minfer_core.testing import GraphBuilder
from minfer_core.testing.strategies import expose, shapes


@st.composite
def scaled_tanh_graphs(draw):
    """ScaledTanh with default or drawn attributes, its output sometimes also a graph output."""
    b = GraphBuilder()
    x = b.input(draw(shapes()))
    attrs = draw(st.sampled_from([{}, {"alpha": 1.0, "beta": 1.0}, {"alpha": 2.0}, {"beta": 0.5}]))
    t = b.op("ScaledTanh", x, domain="com.example", **attrs)
    expose(draw, b, t)
    b.output(b.op("Relu", t))
    return b.build()
