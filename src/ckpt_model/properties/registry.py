"""Every property of the controller contract, checked or not yet, as data: the violation it raises (its ID and
title), when it is judged and whether the checker judges it. docs/how-it-works.md's property table must agree
(tests/unit/checker/test_properties); the JUnit output has a case per entry, and a deployment's coverage names the
properties it cannot judge. Rollout collection's own properties (P22-P25) are `collection`'s, with their own table.
"""

from __future__ import annotations

from typing import Literal

import attrs

from ckpt_model.errors import PropertyViolation
from ckpt_model.model.lineage import P5Violation, P12Violation
from ckpt_model.properties.clocks import P18Violation, P20Violation, P21Violation
from ckpt_model.properties.continuation import P2Violation, P3Violation, P4Violation, P14Violation
from ckpt_model.properties.durability import P9Violation, P16Violation
from ckpt_model.properties.fencing import P10Violation
from ckpt_model.properties.identifiers import P15Violation
from ckpt_model.properties.network import P17Violation, P19Violation
from ckpt_model.properties.scope import P1Violation
from ckpt_model.properties.state import P6Violation, P7Violation, P8Violation, P13Violation
from ckpt_model.properties.telemetry import P26Violation
from ckpt_model.properties.verification import P11Violation


@attrs.frozen
class PropertyInfo:
    """One property: the violation it raises (its ID and title), when it is judged (after a step, at the teardown,
    or both), and whether the checker judges it yet."""

    violation: type[PropertyViolation]
    scope: Literal["step", "teardown", "step and teardown"]
    checked: bool

    @property
    def property_id(self) -> str:
        return self.violation.property_id

    @property
    def title(self) -> str:
        return self.violation.title


REGISTRY: dict[str, PropertyInfo] = {
    info.property_id: info
    for info in (
        PropertyInfo(P1Violation, "step", True),
        PropertyInfo(P2Violation, "step", True),
        PropertyInfo(P3Violation, "step and teardown", True),
        PropertyInfo(P4Violation, "step and teardown", True),
        PropertyInfo(P5Violation, "step and teardown", True),
        PropertyInfo(P6Violation, "step", True),
        PropertyInfo(P7Violation, "step", True),
        PropertyInfo(P8Violation, "step", True),
        PropertyInfo(P9Violation, "step and teardown", True),
        PropertyInfo(P10Violation, "step", True),
        PropertyInfo(P11Violation, "step and teardown", True),
        PropertyInfo(P12Violation, "step and teardown", True),
        PropertyInfo(P13Violation, "teardown", True),
        PropertyInfo(P14Violation, "teardown", True),
        PropertyInfo(P15Violation, "step", True),
        PropertyInfo(P16Violation, "step", True),
        PropertyInfo(P17Violation, "step", True),
        PropertyInfo(P18Violation, "step", True),
        PropertyInfo(P19Violation, "step", True),
        PropertyInfo(P20Violation, "step", True),
        PropertyInfo(P21Violation, "step", True),
        PropertyInfo(P26Violation, "step and teardown", True),
    )
}
