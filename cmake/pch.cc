// The source a target of precompiled headers needs to exist; it has nothing to compile.
int main() {
  return 0;
}
