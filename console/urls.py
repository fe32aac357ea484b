"""Mounted at /console/ by config/urls.py."""

from django.urls import path

from console import views, views_policy, views_signin, views_spend, views_staff, views_tokens

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views_signin.LoginView.as_view(), name="login"),
    path("logout/", views_signin.logout, name="logout"),
    path("sso/start/", views_signin.SignInStart.as_view(), name="sso-start"),
    path("sso/callback/", views_signin.SignInCallback.as_view(), name="sso-callback"),
    path("sso/refused/", views_signin.refused, name="sso-refused"),
    path("tokens/", views_tokens.tokens_page, name="tokens"),
    path("tokens/create/", views_tokens.token_add, name="token-create"),
    path("tokens/<str:prefix>/revoke/", views_tokens.token_delete, name="token-revoke"),
    path("signin/rules/", views_signin.rules_page, name="signin-rules"),
    path("signin/rules/add/", views_signin.rule_add, name="signin-rule-add"),
    path("signin/rules/<int:rule_id>/delete/", views_signin.rule_delete, name="signin-rule-delete"),
    path("queue/", views.queue_page, name="queue"),
    path("spend/", views_spend.spend_page, name="spend"),
    path("keys/create/", views.key_create, name="key-create"),
    path("keys/<str:prefix>/revoke/", views.key_revoke, name="key-revoke"),
    path("keys/<str:prefix>/rotate/", views.key_rotate, name="key-rotate"),
    path("batches/<str:batch_id>/cancel/", views.batch_cancel, name="batch-cancel"),
    path("api/queue/", views.api_queue, name="api-queue"),
    path("api/waits/", views.api_waits, name="api-waits"),
    path("api/request/<str:request_id>/", views.api_request, name="api-request"),
    path("finance/", views_staff.finance_page, name="finance"),
    path("ops/", views_staff.ops_page, name="ops"),
    path("audit/", views_staff.audit_page, name="audit"),
    path("policy/", views_policy.policy_page, name="policy"),
    path("policy/class/<str:name>/", views_policy.class_edit, name="class-edit"),
    path("policy/aging/", views_policy.aging_edit, name="aging-edit"),
    path("policy/fairness/", views_policy.fairness_edit, name="fairness-edit"),
    path("policy/tenant/<slug:slug>/", views_policy.tenant_edit, name="tenant-edit"),
    path("policy/rules/", views_policy.rule_edit, name="rule-edit"),
    path("policy/backend/<str:name>/", views_policy.backend_edit, name="backend-edit"),
]
