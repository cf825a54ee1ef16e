# One image for every moemeter service (twin, serve, dashboard); compose.yaml picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY moemeter ./moemeter
COPY stack ./stack
COPY collectors ./collectors
COPY warehouse ./warehouse
COPY dashboard ./dashboard
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["moemeter"]
