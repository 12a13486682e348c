"""Plan.full_model_allowed: device tiers are advisory, a plan can forbid the full model."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0008_shared_conversation"),
    ]

    operations = [
        migrations.AddField(
            model_name="plan",
            name="full_model_allowed",
            field=models.BooleanField(
                default=True,
                help_text=(
                    "Off: this plan's users are always answered by the lite model, on every "
                    "device, whatever their browser says (checked on the server as each answer "
                    "starts)."
                ),
                verbose_name="full model allowed",
            ),
        ),
    ]
