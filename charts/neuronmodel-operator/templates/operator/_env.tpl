{{/* The operator's environment: one variable per `neuronmodel-operator` flag (operator/neuronmodel_operator/cli.py),
then the Hub's endpoint and the proxy the operator's requests to it take (revisions.py), then extraEnv. */}}
{{- define "neuronmodel-operator.env" -}}
{{- with .Values.watchNamespaces }}
- name: NEURONMODEL_OPERATOR_NAMESPACES
  value: {{ join "," . | quote }}
{{- end }}
- name: NEURONMODEL_OPERATOR_LIVENESS
  value: {{ printf "http://0.0.0.0:%d/healthz" (int .Values.liveness.port) | quote }}
- name: NEURONMODEL_OPERATOR_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: NEURONMODEL_OPERATOR_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: NEURONMODEL_OPERATOR_WORKERS
  value: {{ .Values.workers | quote }}
- name: NEURONMODEL_OPERATOR_WATCH_TIMEOUT_S
  value: {{ .Values.watchTimeoutSeconds | quote }}
{{- if .Values.peering.enabled }}
- name: NEURONMODEL_OPERATOR_PEERING
  value: {{ .Values.peering.name | quote }}
{{- end }}
- name: NEURONMODEL_OPERATOR_PRIORITY
  value: {{ .Values.priority | quote }}
- name: NEURONMODEL_RUNTIME_IMAGE_REPOSITORY
  value: {{ .Values.runtimeImage.repository | quote }}
- name: NEURONMODEL_RUNTIME_IMAGE_VERSION
  value: {{ .Values.runtimeImage.version | default .Chart.AppVersion | quote }}
{{- with .Values.runtimeImage.image }}
- name: NEURONMODEL_RUNTIME_IMAGE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.compileCache.url }}
- name: NEURONMODEL_OPERATOR_COMPILE_CACHE_URL
  value: {{ . | quote }}
{{- end }}
- name: NEURONMODEL_OPERATOR_COMPILE_CACHE_POLICY
  value: {{ .Values.compileCache.policy | quote }}
- name: NEURONMODEL_HPA_METRIC
  value: {{ .Values.hpaMetric | quote }}
- name: NEURONMODEL_OPERATOR_NEURON_SCHEDULER_NAME
  value: {{ .Values.neuronSchedulerName | quote }}
- name: NEURONMODEL_OPERATOR_GROUP_TOPOLOGY_KEY
  value: {{ .Values.multiNode.groupTopologyKey | quote }}
- name: NEURONMODEL_OPERATOR_ALLOW_HOST_PATH
  value: {{ .Values.allowHostPath | quote }}
{{- with .Values.hfEndpoint }}
- name: HF_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.proxy.https }}
- name: HTTPS_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with .Values.proxy.http }}
- name: HTTP_PROXY
  value: {{ . | quote }}
{{- end }}
{{- if or .Values.proxy.https .Values.proxy.http }}
{{- /* the kubernetes client reads the proxy variables too: the API server is reached directly */}}
- name: NO_PROXY
  value: {{ join "," (compact (list .Values.proxy.noProxy "$(KUBERNETES_SERVICE_HOST)")) | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
