"""The gateway's routes (included at the site root by config/urls.py)."""

from django.urls import path

from gateway import views, views_ops

urlpatterns = [
    path("v1/chat/completions", views.chat_completions),
    path("v1/completions", views.completions),
    path("v1/embeddings", views.embeddings),
    path("v1/models", views.models),
    path("v1/queue", views.queue_list),
    path("v1/queue/<str:request_id>", views.queue_detail),
    path("v1/openapi.json", views_ops.openapi_view),
    path("healthz", views_ops.healthz),
    path("readyz", views_ops.readyz),
    path("metrics", views_ops.metrics_view),
]
