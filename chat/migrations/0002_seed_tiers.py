"""Seed the tier policy (ModelTier, DeviceRule) and the default plan (ARCHITECTURE §5, §6)."""

from django.conf import settings
from django.db import migrations

# A migration keeps its own copy of the defaults: importing them from chat.tiers would let a
# later edit there silently rewrite what this historical step did. tests/test_tiers.py checks
# that the seeded rows and chat.tiers.DEFAULT_RULES agree.
DEFAULT_RULES = (
    (10, "save_data", "on", "lite", "Save-Data: on: the user asked the browser to save data."),
    (20, "ect", "slow-2g", "lite", "ECT slow-2g: a very slow network."),
    (30, "ect", "2g", "lite", "ECT 2g: a slow network."),
    (
        40,
        "ch_mobile",
        "?1",
        "lite",
        "Sec-CH-UA-Mobile: ?1: the browser says it is mobile; beats the User-Agent string.",
    ),
    (50, "device", "tablet", "full", "Tablets (incl. Chrome on Android tablets, which sends ?0)."),
    (60, "device", "desktop", "full", "Desktops, smart TVs and consoles."),
    (
        70,
        "ch_mobile",
        "?0",
        "full",
        "Sec-CH-UA-Mobile: ?0: the browser says it is not mobile (e.g. 'desktop site'); "
        "beats a phone User-Agent.",
    ),
    (80, "device", "phone", "lite", "Phones."),
    (90, "device", "bot", "full", "Crawlers and scripts."),
    (100, "device", "unknown", "full", "No usable User-Agent."),
)
DEFAULT_PLAN = "Standard"


def seed(apps, schema_editor):
    ModelTier = apps.get_model("chat", "ModelTier")
    DeviceRule = apps.get_model("chat", "DeviceRule")
    Plan = apps.get_model("chat", "Plan")
    # Read at migrate time, so a deployment's CHAT_MODEL_* become the admin's starting point.
    ModelTier.objects.get_or_create(tier="full", defaults={"model": settings.CHAT_MODEL_FULL})
    ModelTier.objects.get_or_create(tier="lite", defaults={"model": settings.CHAT_MODEL_LITE})
    # Rules only into an empty table: never add a second copy next to an admin's rules.
    if not DeviceRule.objects.exists():
        DeviceRule.objects.bulk_create(
            DeviceRule(order=order, signal=signal, value=value, tier=tier, note=note)
            for order, signal, value, tier, note in DEFAULT_RULES
        )
    # Blank limits mean "the CHAT_* settings".
    Plan.objects.get_or_create(
        name=DEFAULT_PLAN,
        defaults={"is_default": not Plan.objects.filter(is_default=True).exists()},
    )


def unseed(apps, schema_editor):
    ModelTier = apps.get_model("chat", "ModelTier")
    DeviceRule = apps.get_model("chat", "DeviceRule")
    Plan = apps.get_model("chat", "Plan")
    ModelTier.objects.filter(tier__in=("full", "lite")).delete()
    for order, signal, value, _tier, _note in DEFAULT_RULES:
        DeviceRule.objects.filter(order=order, signal=signal, value=value).delete()
    Plan.objects.filter(name=DEFAULT_PLAN).delete()


class Migration(migrations.Migration):
    dependencies = [("chat", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
