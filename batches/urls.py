"""The Batch API's routes (included at the site root by config/urls.py)."""

from django.urls import path

from batches import views

urlpatterns = [
    path("v1/files", views.files_view),
    path("v1/files/<str:file_id>", views.file_detail),
    path("v1/files/<str:file_id>/content", views.file_content),
    path("v1/batches", views.batches_view),
    path("v1/batches/<str:batch_id>", views.batch_detail),
    path("v1/batches/<str:batch_id>/cancel", views.batch_cancel),
]
