# Non-test source lines of one crate: the count the notes on issue #33 report.
#
#     python3 bench-support/count_lines.py <crate dir> [N]
#
# Counts every line of the crate's src/**/*.rs except tests.rs files and the
# items under #[cfg(test)], #[cfg(doctest)] or #[cfg(all(test, ...))],
# wherever in a file they sit: an item's end is found by matching braces over
# the code with strings, raw strings, chars and comments blanked. Prints the
# total, then the N biggest files. Doc comments count: they are source a
# maintainer reads.
import os,sys,re
root=sys.argv[1] if len(sys.argv)>1 else '.'
def blank(src):
    out=[];i=0;n=len(src)
    while i<n:
        c=src[i]
        if src.startswith('//',i):
            j=src.find('\n',i); j=n if j<0 else j; out.append(' '*(j-i)); i=j; continue
        if src.startswith('/*',i):
            j=src.find('*/',i+2); j=n if j<0 else j+2
            out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        m=re.match(r'b?r(#*)"',src[i:i+40])
        if m and (i==0 or not (src[i-1].isalnum() or src[i-1]=='_')):
            end='"'+m.group(1); j=src.find(end,i+len(m.group(0))); j=n if j<0 else j+len(end)
            out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        if c=='"':
            j=i+1
            while j<n and src[j]!='"':
                j+=2 if src[j]=='\\' else 1
            j+=1; out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j; continue
        if c=="'":
            m=re.match(r"'(\\.[^']*|[^\\'])'",src[i:i+12])
            if m: out.append(' '*len(m.group(0))); i+=len(m.group(0)); continue
        out.append(c); i+=1
    return ''.join(out)
def count(path):
    raw=open(path).read().split('\n')
    code=blank('\n'.join(raw)).split('\n')
    if raw and raw[-1]=='': raw=raw[:-1]
    n=0;i=0
    while i<len(raw):
        if re.match(r'#\[cfg\((test|doctest|all\((test\b|[^)]*,\s*test\b)[^)]*\))\)\]', raw[i].strip()):
            j=i+1
            while j<len(raw) and raw[j].strip().startswith('#['): j+=1
            depth=0;started=False
            while j<len(raw):
                t=code[j]; depth+=t.count('{')-t.count('}')
                if '{' in t: started=True
                if (started and depth<=0) or (not started and t.rstrip().endswith(';')): break
                j+=1
            i=j+1; continue
        n+=1;i+=1
    return n
tot=0;files=[]
for d,_,fs in os.walk(root):
    if '/target' in d or '/.git' in d or '/fuzz' in d: continue
    if '/src' not in d+'/': continue
    for f in fs:
        if not f.endswith('.rs') or f=='tests.rs': continue
        p=os.path.join(d,f); k=count(p); tot+=k; files.append((k,os.path.relpath(p,root)))
print('total',tot)
files.sort(reverse=True)
for k,p in files[:int(sys.argv[2]) if len(sys.argv)>2 else 0]: print(k,p)
