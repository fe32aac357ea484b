"""Included under /api/billing/ by config/urls.py."""

from django.urls import path

from billing import views

app_name = "billing"

urlpatterns = [
    path("charges/", views.ChargesView.as_view(), name="charges"),
    path("spend/", views.SpendView.as_view(), name="spend"),
    path("burn/", views.BurnView.as_view(), name="burn"),
    path("burn-series/", views.BurnSeriesView.as_view(), name="burn-series"),
    path("class-shift/", views.ClassShiftView.as_view(), name="class-shift"),
    path("class-mix/", views.ClassMixView.as_view(), name="class-mix"),
    path("what-if/", views.WhatIfView.as_view(), name="what-if"),
    path("ledger/", views.LedgerView.as_view(), name="ledger"),
    path("alerts/", views.AlertsView.as_view(), name="alerts"),
]
