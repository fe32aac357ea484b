from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/console/", permanent=False)),  # the admin's "View site" too
    path("admin/", admin.site.urls),
    path("api/billing/", include("billing.urls")),
    path("console/", include("console.urls")),
    path("", include("batches.urls")),
    path("", include("gateway.urls")),
]

# Django's own errors in the OpenAI shape on the API (gateway.views_ops).
handler400 = "gateway.views_ops.handler400"
handler404 = "gateway.views_ops.handler404"
handler500 = "gateway.views_ops.handler500"
