"""The repeated-structure workload for bench-peers: many requests of one template with different data,
as an application that sends every record of a table through the same prompt does. The answers share
their structure (the same JSON keys, in the same order) across requests, which drafting from earlier
requests' answers (the suffix drafter's corpus, llama-server's ngram cache) can reuse; the values
differ per record. The records are generated from a fixed seed, so no dataset is needed.
"""

from __future__ import annotations

import random

TEMPLATE = (
    "Convert this customer record to a JSON object with the keys \"name\", \"city\", \"plan\", "
    "\"monthly_fee_usd\", \"signup_date\" (YYYY-MM-DD) and \"referred_by\" (null if nobody). "
    "Output only the JSON object, then one sentence that summarises the customer.\n\n"
    "Record: {name} from {city} signed up for the {plan} plan on {month} {day}, {year}, paying "
    "${fee} a month{referral}."
)
NAMES = ("Alice Moreau", "Bilal Khan", "Chen Wei", "Dora Nagy", "Emeka Obi", "Farah Haddad", "Gustavo Lima",
         "Hana Sato", "Ivan Petrov", "Jonas Berg", "Kavya Rao", "Liam Walsh", "Maya Cohen", "Nils Olsen")
CITIES = ("Lyon", "Lahore", "Chengdu", "Debrecen", "Enugu", "Beirut", "Recife", "Osaka", "Kazan", "Bergen",
          "Mysore", "Galway", "Haifa", "Aarhus")
PLANS = (("Basic", 9), ("Standard", 19), ("Premium", 39), ("Team", 79))
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def templated_prompts(count: int, offset: int = 0, seed: int = 7) -> list[str]:
    """`count` prompts of the template, records `offset` to `offset + count - 1` of the seeded sequence."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(offset + count):
        plan, fee = rng.choice(PLANS)
        referrer = rng.choice(NAMES) if rng.random() < 0.5 else None
        prompts.append(TEMPLATE.format(
            name=rng.choice(NAMES), city=rng.choice(CITIES), plan=plan, fee=fee, month=rng.choice(MONTHS),
            day=rng.randint(1, 28), year=rng.randint(2019, 2025),
            referral=f", referred by {referrer}" if referrer else ""))
    return prompts[offset:]
