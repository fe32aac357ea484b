"""The include line config/urls.py is to carry, so these tests do not depend on it."""

from django.urls import include, path

urlpatterns = [path("api/billing/", include("billing.urls"))]
