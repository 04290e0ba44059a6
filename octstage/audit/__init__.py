"""``octstage audit-ids``: the pure overlap core (``core``), its tables, JSON and plot
(``report``), and the command around them (``run``)."""
