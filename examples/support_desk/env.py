"""A small support desk, as a user of coevolve would write it: customers, their orders and
support tickets, with the tools an agent at the desk has.

The tools are the typed, docstringed methods of ``SupportDesk``; coevolve derives their
schemas and builds everything else from ``tasks.jsonl`` (docs/environments.md). Train an
agent on it from the repository root with::

    coevolve run examples/support_desk/config.yaml
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from coevolve.envs import FunctionEnvironment, ToolError

Plan = Literal["basic", "pro", "business"]
RefundReason = Literal["damaged", "late", "wrong_item", "not_needed"]
Topic = Literal["billing", "login", "shipping", "other"]


class SupportDesk:
    """A support desk: customers, their orders and support tickets."""

    def __init__(
        self,
        customers: dict[str, dict[str, Any]],
        orders: dict[str, dict[str, Any]],
        tickets: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.customers = customers
        self.orders = orders
        self.tickets = tickets or {}

    def _customer(self, customer_id: str) -> dict[str, Any]:
        if customer_id not in self.customers:
            raise ToolError("not_found", f"no customer {customer_id}")
        return self.customers[customer_id]

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.orders:
            raise ToolError("not_found", f"no order {order_id}")
        return self.orders[order_id]

    def find_customer(self, email: str) -> str:
        """Find a customer by email address.

        Args:
            email: The customer's email address.
        """
        for customer_id, customer in self.customers.items():
            if customer["email"] == email.strip().lower():
                return (
                    f"customer_id={customer_id} name={customer['name']} "
                    f"email={customer['email']} plan={customer['plan']}"
                )
        raise ToolError("not_found", f"no customer with email {email}")

    def list_orders(self, customer_id: str) -> str:
        """List a customer's orders.

        Args:
            customer_id: The customer's id, e.g. C-101.
        """
        self._customer(customer_id)
        rows = [
            f"order_id={order_id} item={order['item']} total={order['total']} "
            f"status={order['status']}"
            for order_id, order in self.orders.items()
            if order["customer_id"] == customer_id
        ]
        return "\n".join(rows) or "no orders"

    def change_plan(self, customer_id: str, plan: Plan) -> str:
        """Move a customer to another plan.

        Args:
            customer_id: The customer's id, e.g. C-101.
            plan: The new plan.
        """
        customer = self._customer(customer_id)
        if customer["plan"] == plan:
            raise ToolError("invalid_value", f"{customer_id} is already on the {plan} plan")
        customer["plan"] = plan
        return f"customer_id={customer_id} plan={plan}"

    def update_email(self, customer_id: str, new_email: str) -> str:
        """Change a customer's email address.

        Args:
            customer_id: The customer's id, e.g. C-101.
            new_email: The new email address.
        """
        customer = self._customer(customer_id)
        if "@" not in new_email:
            raise ToolError("invalid_value", f"{new_email!r} is not an email address")
        customer["email"] = new_email.strip().lower()
        return f"customer_id={customer_id} email={customer['email']}"

    def refund_order(self, order_id: str, reason: RefundReason) -> str:
        """Refund a delivered order.

        Args:
            order_id: The order's id, e.g. O-5001.
            reason: Why the customer wants the refund.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError("not_refundable", f"order {order_id} is {order['status']}")
        order["status"] = "refunded"
        order["refund_reason"] = reason
        return f"order_id={order_id} status=refunded amount={order['total']}"

    def cancel_order(self, order_id: str) -> str:
        """Cancel an order that has not shipped yet.

        Args:
            order_id: The order's id, e.g. O-5001.
        """
        order = self._order(order_id)
        if order["status"] != "processing":
            raise ToolError("not_cancellable", f"order {order_id} is {order['status']}")
        order["status"] = "cancelled"
        return f"order_id={order_id} status=cancelled"

    def open_ticket(self, customer_id: str, topic: Topic) -> str:
        """Open a support ticket for a customer.

        Args:
            customer_id: The customer's id, e.g. C-101.
            topic: What the ticket is about.
        """
        self._customer(customer_id)
        ticket_id = f"T-{len(self.tickets) + 1:03d}"
        self.tickets[ticket_id] = {"customer_id": customer_id, "topic": topic, "status": "open"}
        return f"ticket_id={ticket_id} status=open"


def make_env() -> FunctionEnvironment:
    """A fresh support desk; its tasks are in tasks.jsonl beside this file."""
    return FunctionEnvironment(
        SupportDesk,
        tasks=Path(__file__).with_name("tasks.jsonl"),
        name="support desk",
        description="example: a support desk (customers, orders, tickets) from plain Python",
    )
