"""client/api.py's INPUT_TYPES against the server's own table (serving/inputs.py): the client stands
alone (it imports nothing of the server's package), so this test is what ties the two. Every input the
client sends is one the server serves, with the same Triton type and the same shape (a list or one
value); the served inputs the client leaves out are named here."""

from __future__ import annotations

from client.api import INPUT_TYPES
from minions.serving.inputs import SERVED

NOT_SENT_BY_THE_CLIENT = {"random_seed", "return_log_probs"}
"""`random_seed`: tensorrt_llm_bls's name for `seed` (the client sends `seed`); `return_log_probs`: the
client does not read log probabilities."""


def test_every_input_the_client_sends_is_served_with_its_type_and_shape():
    for name, (triton_type, _, is_list) in INPUT_TYPES.items():
        served = SERVED.get(name)
        assert served is not None, f"the client sends {name!r}, which the server does not serve"
        expected = "BYTES" if served.data_type == "TYPE_STRING" else served.data_type.removeprefix("TYPE_")
        assert triton_type == expected, f"{name}: the client sends {triton_type}, the server reads {served.data_type}"
        assert is_list == (served.dims == (-1,)), f"{name}: the client and the server differ on a list or a value"


def test_the_client_sends_every_served_input_but_those_it_names_as_left_out():
    assert set(SERVED) - set(INPUT_TYPES) == NOT_SENT_BY_THE_CLIENT
