"""Tenant, User and ApiKey move here from the gateway app: the models only (state), not the tables.

The tables keep their names (``gateway_tenant``, ``gateway_user`` and its many-to-many tables,
``gateway_apikey``) and their rows; nothing is written to the database. gateway.0003 then removes
the models from the gateway app's state, after every foreign key points here (billing.0005).
A database made before this migration existed is adopted by ``manage.py migrate`` itself
(tenants.management.commands.migrate): this migration is recorded there as applied, since
``admin`` and ``auth``'s tables depend on the user model it declares.
"""

from decimal import Decimal

import django.contrib.auth.models
import django.contrib.auth.validators
import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("gateway", "0002_downgrade_event"),  # the tables exist, made by gateway.0001
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Tenant",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("slug", models.SlugField(max_length=64, unique=True)),
                        ("name", models.CharField(max_length=200)),
                        (
                            "quota_share",
                            models.DecimalField(
                                decimal_places=4,
                                help_text="Weight for fair sharing inside a class (0 < share <= 1).",
                                max_digits=6,
                                validators=[
                                    django.core.validators.MinValueValidator(Decimal("0.0001")),
                                    django.core.validators.MaxValueValidator(Decimal("1")),
                                ],
                            ),
                        ),
                        ("annual_budget", models.DecimalField(blank=True, decimal_places=6, max_digits=18, null=True)),
                        (
                            "allowed_classes",
                            models.JSONField(
                                blank=True,
                                default=list,
                                help_text="Class names this tenant may declare; empty means all.",
                            ),
                        ),
                        ("vip", models.BooleanField(default=False)),
                        ("active", models.BooleanField(default=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "db_table": "gateway_tenant",
                        "ordering": ["slug"],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("quota_share__gt", 0), ("quota_share__lte", 1)),
                                name="tenant_quota_share_range",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="ApiKey",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("label", models.CharField(blank=True, max_length=200)),
                        ("default_class", models.CharField(max_length=32)),
                        ("prefix", models.CharField(max_length=16, unique=True)),
                        ("secret_hash", models.CharField(max_length=64)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("revoked_at", models.DateTimeField(blank=True, null=True)),
                        ("last_used_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="api_keys",
                                to="tenants.tenant",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "gateway_apikey",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="User",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("password", models.CharField(max_length=128, verbose_name="password")),
                        ("last_login", models.DateTimeField(blank=True, null=True, verbose_name="last login")),
                        (
                            "is_superuser",
                            models.BooleanField(
                                default=False,
                                help_text="Designates that this user has all permissions without explicitly assigning them.",
                                verbose_name="superuser status",
                            ),
                        ),
                        (
                            "username",
                            models.CharField(
                                error_messages={"unique": "A user with that username already exists."},
                                help_text="Required. 150 characters or fewer. Letters, digits and @/./+/-/_ only.",
                                max_length=150,
                                unique=True,
                                validators=[django.contrib.auth.validators.UnicodeUsernameValidator()],
                                verbose_name="username",
                            ),
                        ),
                        ("first_name", models.CharField(blank=True, max_length=150, verbose_name="first name")),
                        ("last_name", models.CharField(blank=True, max_length=150, verbose_name="last name")),
                        ("email", models.EmailField(blank=True, max_length=254, verbose_name="email address")),
                        (
                            "is_staff",
                            models.BooleanField(
                                default=False,
                                help_text="Designates whether the user can log into this admin site.",
                                verbose_name="staff status",
                            ),
                        ),
                        (
                            "is_active",
                            models.BooleanField(
                                default=True,
                                help_text="Designates whether this user should be treated as active. Unselect this instead of deleting accounts.",
                                verbose_name="active",
                            ),
                        ),
                        (
                            "date_joined",
                            models.DateTimeField(default=django.utils.timezone.now, verbose_name="date joined"),
                        ),
                        (
                            "role",
                            models.CharField(
                                choices=[("member", "Member"), ("finance", "Finance"), ("admin", "Admin")],
                                default="member",
                                max_length=16,
                            ),
                        ),
                        (
                            "groups",
                            models.ManyToManyField(
                                blank=True,
                                help_text="The groups this user belongs to. A user will get all permissions granted to each of their groups.",
                                related_name="user_set",
                                related_query_name="user",
                                to="auth.group",
                                verbose_name="groups",
                            ),
                        ),
                        (
                            "user_permissions",
                            models.ManyToManyField(
                                blank=True,
                                help_text="Specific permissions for this user.",
                                related_name="user_set",
                                related_query_name="user",
                                to="auth.permission",
                                verbose_name="user permissions",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="users",
                                to="tenants.tenant",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "user",
                        "verbose_name_plural": "users",
                        "db_table": "gateway_user",
                        "abstract": False,
                    },
                    managers=[
                        ("objects", django.contrib.auth.models.UserManager()),
                    ],
                ),
            ],
            database_operations=[],
        ),
    ]
