{{/* The image every container runs: repository:tag, the tag the chart's appVersion unless set. */}}
{{- define "sticky-macvlan.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The reconcile Deployment's pod labels, which its Service selects. */}}
{{- define "sticky-macvlan.reconcileSelector" -}}
app.kubernetes.io/name: sticky-macvlan-reconcile
{{- end }}
